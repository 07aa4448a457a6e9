# Runs EXE under mpirun with NP ranks and ARGS; passes only when the job ends within the time limit with a non-zero
# exit and NP distinct ranks printed a line "... rank R...EXPECT..." (the error was seen on every rank, not just
# where it happened). EXPECT is a regular expression matched after the rank number on the same line.
string(REPLACE ";" " " shown "${ARGS}")
separate_arguments(args UNIX_COMMAND "${shown}")
execute_process(COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -np ${NP} ${EXE} ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
set(log "${out}${err}")
if(NOT rc MATCHES "^-?[0-9]+$")
  message(FATAL_ERROR "'${shown}' did not end by itself (${rc}); a hang is a failure\n${log}")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit for '${shown}', got 0\n${log}")
endif()
string(REPLACE ";" "," flat "${log}")  # list separators inside lines would split the matches below
string(REGEX MATCHALL "rank [0-9]+[^\n]*" lines "${flat}")
set(ranks "")
foreach(line IN LISTS lines)
  if(line MATCHES "${EXPECT}" AND line MATCHES "^rank ([0-9]+)")
    list(APPEND ranks ${CMAKE_MATCH_1})
  endif()
endforeach()
list(REMOVE_DUPLICATES ranks)
list(LENGTH ranks n)
if(n LESS NP)
  message(FATAL_ERROR "expected '${EXPECT}' from ${NP} distinct ranks, got it from ${n} (ranks: ${ranks}; exit ${rc})\n${log}")
endif()
message(STATUS "exit ${rc}; '${EXPECT}' on ranks ${ranks}")
