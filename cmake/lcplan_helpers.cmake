# Small helpers shared by every folder's CMakeLists.txt.

# lcplan_test(NAME <name> SOURCES <files...> LIBS <targets...> [MPI_NP <n>] [LABELS <labels...>] [ARGS <args...>])
# A GoogleTest binary registered with CTest; with MPI_NP it runs under mpirun (root-safe, oversubscribed). ARGS go to
# the binary (a --gtest_filter that leaves some suites to another CTest entry of the same binary).
function(lcplan_test)
  cmake_parse_arguments(T "" "NAME;MPI_NP" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE LCPLAN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(T_MPI_NP)
    add_test(NAME ${T_NAME}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${T_MPI_NP}
                     $<TARGET_FILE:${T_NAME}> ${T_ARGS})
    set_tests_properties(${T_NAME} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT 300)
  else()
    add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES ENVIRONMENT "LCPLAN_DATA_DIR=${PROJECT_SOURCE_DIR}")
  # GPU tests GTEST_SKIP without a device; report that to CTest as skipped, not passed -- but only when nothing
  # failed: tests/common/gpu_skip_marker.cpp prints the marker then (CTest skips on a match whatever the exit status).
  if("gpu" IN_LIST T_LABELS)
    target_sources(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common/gpu_skip_marker.cpp)
    if(T_MPI_NP)
      target_compile_definitions(${T_NAME} PRIVATE LCPLAN_TEST_MPI)
      target_link_libraries(${T_NAME} PRIVATE MPI::MPI_CXX)
    endif()
    lcplan_gpu_test_row(${T_NAME} ${T_NAME} "${T_MPI_NP}")
  endif()
endfunction()

# A GPU test's skip rule and its manifest row for lcplan selftest --gpu (lcplan_write_gpu_test_manifest): the binary
# relative to the build tree, so a build carried to a GPU node finds its tests wherever it lands.
function(lcplan_gpu_test_row name target np)
  set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "lcplan-gpu-test: [0-9]+ skipped, none failed")
  file(RELATIVE_PATH rel ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/${target})
  if(NOT np)
    set(np 0)
  endif()
  set_property(GLOBAL APPEND PROPERTY LCPLAN_GPU_TESTS "${name}\t${rel}\t${np}")
endfunction()

# lcplan_gpu_test_ranks(NAME <name> OF <gpu test target> MPI_NP <n> [LABELS ...]): the same GPU test binary again
# under another rank count (its cases pick the world size they run on), without building it twice.
function(lcplan_gpu_test_ranks)
  cmake_parse_arguments(T "" "NAME;OF;MPI_NP" "LABELS" ${ARGN})
  add_test(NAME ${T_NAME}
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${T_MPI_NP}
                   $<TARGET_FILE:${T_OF}>)
  set_tests_properties(${T_NAME} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT 300
                       ENVIRONMENT "LCPLAN_DATA_DIR=${PROJECT_SOURCE_DIR}")
  lcplan_gpu_test_row(${T_NAME} ${T_OF} ${T_MPI_NP})
endfunction()

# Writes <build>/gpu_tests.tsv, the GPU tests lcplan_test registered (name, binary relative to the build tree, MPI
# ranks or 0): what lcplan selftest --gpu runs. Called once, after every folder is added.
function(lcplan_write_gpu_test_manifest)
  get_property(rows GLOBAL PROPERTY LCPLAN_GPU_TESTS)
  set(text "# name\tbinary relative to the build tree\tMPI ranks (0: a plain binary)\n")
  foreach(row ${rows})
    string(APPEND text "${row}\n")
  endforeach()
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/gpu_tests.tsv CONTENT "${text}" @ONLY)
endfunction()

# lcplan_bench(NAME <name> SOURCES <files...> LIBS <targets...>)
function(lcplan_bench)
  if(NOT LCPLAN_BENCH)
    return()
  endif()
  cmake_parse_arguments(B "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${B_NAME} ${B_SOURCES})
  target_link_libraries(${B_NAME} PRIVATE ${B_LIBS} benchmark::benchmark)
  target_compile_definitions(${B_NAME} PRIVATE LCPLAN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endfunction()
