# ops.cmake — the operator runtime's part of the build (included from CMakeLists.txt after the core targets):
# its sources in libferry, the GEMM kernel sources embedded as text for NVRTC, its CPU and GPU tests, the latency
# benchmark in the ferry CLI, and `ferry_check_kernels` (nvcc resource report of every kernel design).

set(ferry_kernel_texts gemm_params.cuh gemm_kind.cuh gemm_common.cuh gemm_output.cuh
  gemm_simt.cu gemm_mma.cu gemm_mma_sw.cu gemm_wgmma.cu)
set(ferry_kernel_text_sources)
foreach(f ${ferry_kernel_texts})
  string(REGEX REPLACE "\\.(cuh|cu)$" "" sym ${f})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/kernel_text_${sym}.c)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/${f} -DOUTPUT=${out}
            -DSYMBOL=ferry__kernel_${sym} -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS src/kernels/${f} cmake/embed.cmake COMMENT "embedding src/kernels/${f}")
  list(APPEND ferry_kernel_text_sources ${out})
endforeach()

target_sources(ferry_objects PRIVATE
  src/rtc.c src/ops/args.c src/ops/registry.c src/ops/supports.c src/ops/target.c src/ops/source.c
  src/ops/compile.c src/ops/cache.c src/ops/artifact.c src/ops/run.c src/ops/graph.c src/ops/sha256.c
  src/ops/xxh64.c ${ferry_kernel_text_sources})

if(FERRY_BUILD_TOOLS)
  target_sources(ferry_cli PRIVATE bench/latency.c)
  # ferry_time_gemm: device time of every tensor-core design (wgmma too, unless FERRY_WGMMA=0) beside cuBLAS, each
  # output checked against cuBLAS's; cuBLAS through the benchmarks' dlopen wrapper.
  add_executable(ferry_time_gemm bench/time_gemm.c bench/common.c bench/cublas.c)
  target_include_directories(ferry_time_gemm PRIVATE ${FERRY_CUDA_INCLUDE} src src/ops bench)
  target_link_libraries(ferry_time_gemm PRIVATE ferry_static m ${CMAKE_DL_LIBS})
endif()

if(FERRY_BUILD_TESTS)
  # The toolkit's NVRTC, when this machine has one: then the compile tests must run, not skip.
  find_library(FERRY_NVRTC_LIBRARY NAMES nvrtc HINTS ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES lib64 lib)
  add_executable(ferry_test_ops tests/common/runner.c tests/common/fake_driver.c tests/cpu/test_ops_args.c
    tests/cpu/test_ops_find.c tests/cpu/test_ops_compile.c tests/cpu/test_ops_cache.c tests/cpu/test_ops_faults.c)
  target_compile_definitions(ferry_test_ops PRIVATE TEST_LIST_HEADER="test_list_ops.h")
  target_include_directories(ferry_test_ops PRIVATE ${FERRY_CUDA_INCLUDE} src src/ops tests/common tests/cpu)
  target_link_libraries(ferry_test_ops PRIVATE ferry_static)
  add_test(NAME ops COMMAND ferry_test_ops)
  if(FERRY_NVRTC_LIBRARY)
    set_tests_properties(ops PROPERTIES ENVIRONMENT "FERRY_REQUIRE_NVRTC=1")
  endif()

  # The operator runtime's GPU suite (ctest name ops_gpu, label gpu: skips without a GPU); its fault matrix also
  # runs through the simulated driver (ops_faults_simulated).
  add_executable(ferry_test_ops_gpu tests/common/runner.c tests/gpu/test_ops_gpu.c tests/gpu/fault_ops_gpu.c
    tests/gpu/fault_ops_rig.c tests/common/fake_driver.c)
  target_compile_definitions(ferry_test_ops_gpu PRIVATE TEST_LIST_HEADER="test_list_ops_gpu.h")
  target_include_directories(ferry_test_ops_gpu PRIVATE ${FERRY_CUDA_INCLUDE} src src/ops tests/common tests/gpu)
  target_link_libraries(ferry_test_ops_gpu PRIVATE ferry_static m)
  add_test(NAME ops_gpu COMMAND ferry_test_ops_gpu)
  set_tests_properties(ops_gpu PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
  add_test(NAME ops_faults_simulated COMMAND ferry_test_ops_gpu --simulate every_failing_runtime_call_is_clean)
endif()

# nvcc's view of every built-in design (registers, spills, shared memory): `cmake --build B --target
# ferry_check_kernels`. The same sources NVRTC compiles at run time, with the defaults of their macros varied.
if(FERRY_NVCC)
  set(check_cmds)
  foreach(design "128;256;32;2;4;3;8" "128;128;32;2;2;4;8" "64;64;32;2;2;3;8" "64;64;32;2;2;2;1")
    list(GET design 0 bm)
    list(GET design 1 bn)
    list(GET design 2 bk)
    list(GET design 3 wm)
    list(GET design 4 wn)
    list(GET design 5 st)
    list(GET design 6 vec)
    foreach(majors "-DFERRY_A_ROW=1 -DFERRY_B_ROW=1" "-DFERRY_A_ROW=0 -DFERRY_B_ROW=0")
      separate_arguments(maj UNIX_COMMAND "${majors}")
      list(APPEND check_cmds COMMAND ${CMAKE_COMMAND} -E echo "gemm_mma ${bm}x${bn}x${bk} s${st} vec${vec} ${majors}"
        COMMAND ${FERRY_NVCC} -arch=sm_90 -cubin -o ${CMAKE_CURRENT_BINARY_DIR}/check_mma.cubin -Xptxas -v
                -DFERRY_BM=${bm} -DFERRY_BN=${bn} -DFERRY_BK=${bk} -DFERRY_WARPS_M=${wm} -DFERRY_WARPS_N=${wn}
                -DFERRY_STAGES=${st} -DFERRY_VEC=${vec} ${maj} ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/gemm_mma.cu)
    endforeach()
  endforeach()
  # gemm_mma_sw.cu: the designs of add_mma(FERRY__MMA_SW, ...) in src/ops/registry.c, in the benchmark's kind
  # (bf16 row-major in and out) and column-major throughout; they sit at the 255-register ceiling, so spills are
  # the thing to watch for.
  foreach(design "128;128;64;2;2;3" "128;256;64;2;4;3" "256;128;64;4;2;3" "128;256;64;2;4;4")
    list(GET design 0 bm)
    list(GET design 1 bn)
    list(GET design 2 bk)
    list(GET design 3 wm)
    list(GET design 4 wn)
    list(GET design 5 st)
    foreach(majors "-DFERRY_A_ROW=1 -DFERRY_B_ROW=1 -DFERRY_OUT_ROW=1" "-DFERRY_A_ROW=0 -DFERRY_B_ROW=0 -DFERRY_OUT_ROW=0")
      separate_arguments(maj UNIX_COMMAND "${majors}")
      list(APPEND check_cmds COMMAND ${CMAKE_COMMAND} -E echo "gemm_mma_sw ${bm}x${bn}x${bk} s${st} bf16 ${majors}"
        COMMAND ${FERRY_NVCC} -arch=sm_90 -cubin -o ${CMAKE_CURRENT_BINARY_DIR}/check_mma_sw.cubin -Xptxas -v
                -DFERRY_BM=${bm} -DFERRY_BN=${bn} -DFERRY_BK=${bk} -DFERRY_WARPS_M=${wm} -DFERRY_WARPS_N=${wn}
                -DFERRY_STAGES=${st} -DFERRY_A_TYPE=FERRY_SCALAR_BF16 -DFERRY_OUT_TYPE=FERRY_SCALAR_BF16 ${maj}
                ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/gemm_mma_sw.cu)
    endforeach()
  endforeach()
  # gemm_wgmma.cu: sm_90a only (wgmma needs the architecture-specific target), in the same two kinds.
  foreach(majors "-DFERRY_A_ROW=1 -DFERRY_B_ROW=1 -DFERRY_OUT_ROW=1" "-DFERRY_A_ROW=0 -DFERRY_B_ROW=0 -DFERRY_OUT_ROW=0")
    separate_arguments(maj UNIX_COMMAND "${majors}")
    list(APPEND check_cmds COMMAND ${CMAKE_COMMAND} -E echo "gemm_wgmma 128x256x64 s4 bf16 ${majors}"
      COMMAND ${FERRY_NVCC} -gencode=arch=compute_90a,code=sm_90a -cubin
              -o ${CMAKE_CURRENT_BINARY_DIR}/check_wgmma.cubin -Xptxas -v -DFERRY_A_TYPE=FERRY_SCALAR_BF16
              -DFERRY_OUT_TYPE=FERRY_SCALAR_BF16 ${maj} ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/gemm_wgmma.cu)
  endforeach()
  add_custom_target(ferry_check_kernels ${check_cmds}
    COMMAND ${CMAKE_COMMAND} -E echo "gemm_simt"
    COMMAND ${FERRY_NVCC} -arch=sm_90 -cubin -o ${CMAKE_CURRENT_BINARY_DIR}/check_simt.cubin -Xptxas -v
            ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/gemm_simt.cu
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels VERBATIM
    COMMENT "nvcc -Xptxas -v over ferry's GEMM designs")
endif()

# The tensor-core kernels run on the CPU (tests/kernels/emulate_cuda.h): every gemm_mma_sw design and the
# gemm_wgmma design in four kinds over edge, batched, alpha/beta and k=0 cases, with gemm_mma.cu as the control, and
# the mutants the emulation must catch. No GPU needed; a C++17 compiler is. `cmake --build B --target ferry_emulate_kernels`; also a test.
find_program(FERRY_CXX_FOR_EMULATION NAMES c++ g++ clang++)
if(FERRY_BUILD_TESTS AND FERRY_CXX_FOR_EMULATION)
  add_custom_target(ferry_emulate_kernels
    COMMAND ${CMAKE_COMMAND} -E env CXX=${FERRY_CXX_FOR_EMULATION}
            sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/kernels/emulate.sh ${CMAKE_CURRENT_BINARY_DIR}/emulate
    COMMAND ${CMAKE_COMMAND} -E env CXX=${FERRY_CXX_FOR_EMULATION}
            sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/kernels/mutants.sh ${CMAKE_CURRENT_BINARY_DIR}/mutants
    USES_TERMINAL VERBATIM COMMENT "the tensor-core GEMM kernels, emulated on the CPU")
  add_test(NAME kernels_emulated COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/kernels/emulate.sh
           ${CMAKE_CURRENT_BINARY_DIR}/emulate)
  add_test(NAME kernels_emulated_mutants COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/kernels/mutants.sh
           ${CMAKE_CURRENT_BINARY_DIR}/mutants)
  set_tests_properties(kernels_emulated kernels_emulated_mutants PROPERTIES
    ENVIRONMENT "CXX=${FERRY_CXX_FOR_EMULATION}" TIMEOUT 900)
endif()
