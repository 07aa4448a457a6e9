# Runs EXE under mpirun with NP ranks and ARGS; passes only when the job exits non-zero and every rank
# printed EXPECT (so the error was seen everywhere, not just where it happened).
string(REPLACE ";" " " shown "${ARGS}")
separate_arguments(args UNIX_COMMAND "${shown}")
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${NP} ${EXE} ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit for '${shown}', got 0\n${out}${err}")
endif()
string(REGEX MATCHALL "${EXPECT}" hits "${out}${err}")
list(LENGTH hits n)
if(n LESS NP)
  message(FATAL_ERROR "expected '${EXPECT}' from all ${NP} ranks, saw it ${n} times (exit ${rc})\n${out}${err}")
endif()
message(STATUS "exit ${rc}; '${EXPECT}' on ${n} ranks")
