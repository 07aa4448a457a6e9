# Runs EXE under mpirun with NP ranks and ARGS; passes only when the job exits 0 within the time limit and its
# output matches the regular expression EXPECT (ctest's PASS_REGULAR_EXPRESSION alone would ignore the exit code).
string(REPLACE ";" " " shown "${ARGS}")
separate_arguments(args UNIX_COMMAND "${shown}")
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${NP} ${EXE} ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 110)
set(log "${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "'${shown}' ended with '${rc}', expected exit 0\n${log}")
endif()
if(NOT log MATCHES "${EXPECT}")
  message(FATAL_ERROR "'${shown}' exited 0 but its output does not match '${EXPECT}'\n${log}")
endif()
message(STATUS "exit 0; output matches '${EXPECT}'")
