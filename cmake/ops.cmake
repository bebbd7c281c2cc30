# ops.cmake — the operator runtime's part of the build (included from CMakeLists.txt after the core targets):
# its sources in libferry, the GEMM kernel sources embedded as text for NVRTC, its CPU and GPU tests, the latency
# benchmark in the ferry CLI, and `ferry_check_kernels` (nvcc resource report of every kernel design).

# The kernel parameter's header is the public one (include/ferry/gemm_params.h): host and kernels share it.
set(ferry_kernel_texts include/ferry/gemm_params.h src/kernels/gemm_kind.cuh src/kernels/gemm_common.cuh
  src/kernels/gemm_output.cuh src/kernels/gemm_simt.cu src/kernels/gemm_mma.cu src/kernels/gemm_mma_sw.cu
  src/kernels/gemm_wgmma.cu)
set(ferry_kernel_text_sources)
foreach(f ${ferry_kernel_texts})
  get_filename_component(sym ${f} NAME_WE)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/kernel_text_${sym}.c)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${CMAKE_CURRENT_SOURCE_DIR}/${f} -DOUTPUT=${out}
            -DSYMBOL=ferry__kernel_${sym} -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${f} cmake/embed.cmake COMMENT "embedding ${f}")
  list(APPEND ferry_kernel_text_sources ${out})
endforeach()

target_sources(ferry_objects PRIVATE
  src/rtc.c src/ops/args.c src/ops/registry.c src/ops/supports.c src/ops/target.c src/ops/source.c
  src/ops/compile.c src/ops/cache.c src/ops/artifact.c src/ops/run.c src/ops/tma.c src/ops/graph.c src/ops/sha256.c
  src/ops/xxh64.c ${ferry_kernel_text_sources})

if(FERRY_BUILD_TOOLS)
  target_sources(ferry_cli PRIVATE bench/latency.c)
  # ferry_time_gemm: device time of every tensor-core design (wgmma too, unless FERRY_WGMMA=0) beside cuBLAS, each
  # output checked against cuBLAS's; cuBLAS through the benchmarks' dlopen wrapper.
  add_executable(ferry_time_gemm bench/time_gemm.c bench/common.c bench/cublas.c)
  target_include_directories(ferry_time_gemm PRIVATE ${FERRY_CUDA_INCLUDE} src src/ops bench)
  target_link_libraries(ferry_time_gemm PRIVATE ferry_static m ${CMAKE_DL_LIBS})
  if(FERRY_BUILD_TESTS)
    # Its command line, as the `ferry` program's (tests/cli/check_cli.cmake): no GPU needed.
    function(time_gemm_test name status stream regex)
      add_test(NAME cli_time_gemm_${name} COMMAND ${CMAKE_COMMAND} -DCLI=$<TARGET_FILE:ferry_time_gemm>
        -DWORK=${CMAKE_CURRENT_BINARY_DIR}/cli_check/time_gemm_${name} "-DARGS=${ARGN}" -DRC=${status}
        -DSTREAM=${stream} "-DMATCH=${regex}" -P ${CMAKE_CURRENT_SOURCE_DIR}/tests/cli/check_cli.cmake)
    endfunction()
    time_gemm_test(help 0 stdout "^usage: ferry_time_gemm .*--shape M N K.*--epilogues" --help)
    time_gemm_test(unknown_argument 2 stderr "^ferry_time_gemm: unknown or incomplete argument '--bogus'" --bogus)
    time_gemm_test(incomplete_shape 2 stderr "^ferry_time_gemm: unknown or incomplete argument '--shape'"
      --shape 16 8192)
    time_gemm_test(bad_shape 2 stderr "^ferry_time_gemm: bad --size or --shape" --shape 0 8192 8192)
    time_gemm_test(without_a_gpu_says_so 0 stdout "^ferry_time_gemm: no GPU here" --shape 16 8192 8192)
    time_gemm_test(help_names_the_8bit_kinds 0 stdout "--int8 \\| --fp8.*cuBLASLt" --help)
    time_gemm_test(size_with_a_suffix 2 stderr "^ferry: --size expects an integer from 0 to 2147483647, got '4096x'"
      --size 4096x)
    time_gemm_test(size_past_an_int 2 stderr "^ferry: --size expects an integer .*got '5000000000'" --size 5000000000)
    time_gemm_test(launches_in_exponent_form 2 stderr "^ferry: --launches expects an integer .*got '1e3'"
      --launches 1e3)
    time_gemm_test(short_help 0 stdout "^usage: ferry_time_gemm" -h)
    time_gemm_test(int8_takes_no_epilogue 2 stderr "^ferry_time_gemm: --epilogues does not go with --int8" --int8
      --epilogues)
    time_gemm_test(fp8_needs_k_in_16s 2 stderr "^ferry_time_gemm: 8-bit operands need K a multiple of 16" --fp8
      --shape 16 8192 8190)
    time_gemm_test(fp8_without_a_gpu_says_so 0 stdout "^ferry_time_gemm: no GPU here" --fp8)
    time_gemm_test(one_type_at_most 2 stderr "^ferry_time_gemm: one of --fp16, --int8, --fp8 at most" --int8 --fp16)
  endif()
endif()

if(FERRY_BUILD_TESTS)
  # The toolkit's NVRTC, when this machine has one: then the compile tests must run, not skip.
  find_library(FERRY_NVRTC_LIBRARY NAMES nvrtc HINTS ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES lib64 lib)
  add_executable(ferry_test_ops tests/common/runner.c tests/common/fake_driver.c tests/common/failing_alloc.c
    tests/cpu/test_ops_args.c tests/cpu/test_ops_find.c tests/cpu/test_ops_registry.c tests/cpu/test_ops_compile.c
    tests/cpu/test_ops_cache.c tests/cpu/test_ops_faults.c)
  target_compile_definitions(ferry_test_ops PRIVATE TEST_LIST_HEADER="test_list_ops.h")
  target_include_directories(ferry_test_ops PRIVATE ${FERRY_CUDA_INCLUDE} src src/ops tests/common tests/cpu)
  target_link_libraries(ferry_test_ops PRIVATE ferry_static)
  # The allocation-failure seam (tests/common/failing_alloc.h): the program's and libferry's allocations go
  # through its wrappers. Link-time only: the library itself has no hook.
  target_link_options(ferry_test_ops PRIVATE
    -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=free)
  add_test(NAME ops COMMAND ferry_test_ops)
  if(FERRY_NVRTC_LIBRARY)
    set_tests_properties(ops PROPERTIES ENVIRONMENT "FERRY_REQUIRE_NVRTC=1")
  endif()
  # A test that cannot run reports a skip, not a pass: a compile test with NVRTC pointed at nothing.
  add_test(NAME compile_tests_skip_without_nvrtc COMMAND ferry_test_ops compile_is_memoised)
  set_tests_properties(compile_tests_skip_without_nvrtc PROPERTIES
    ENVIRONMENT "FERRY_NVRTC=/nonexistent/libnvrtc.so" PASS_REGULAR_EXPRESSION "skip compile_is_memoised.*0 passed, 0 failed, 1 skipped")

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
  # The designs: src/ops/gemm_designs.def, one FERRY_GEMM_DESIGN(FAMILY, BM, BN, BK, WARPS_M, WARPS_N, WARPS_K,
  # STAGES, VEC, SPEED, EXPERIMENTAL) a line.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/ops/gemm_designs.def)
  file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/src/ops/gemm_designs.def design_lines REGEX "^FERRY_GEMM_DESIGN\\(")
  set(check_cmds)
  foreach(line ${design_lines})
    string(REGEX REPLACE "^FERRY_GEMM_DESIGN\\(([^)]*)\\).*" "\\1" fields "${line}")
    string(REPLACE " " "" fields "${fields}")
    string(REPLACE "," ";" fields "${fields}")
    list(GET fields 0 family)
    list(GET fields 1 bm)
    list(GET fields 2 bn)
    list(GET fields 3 bk)
    list(GET fields 4 wm)
    list(GET fields 5 wn)
    list(GET fields 6 wk)
    list(GET fields 7 st)
    list(GET fields 8 vec)
    set(design_flags -DFERRY_BM=${bm} -DFERRY_BN=${bn} -DFERRY_BK=${bk} -DFERRY_WARPS_M=${wm} -DFERRY_WARPS_N=${wn}
        -DFERRY_STAGES=${st})
    if(family STREQUAL "MMA")
      # gemm_mma.cu in the default kind (fp16 in, fp32 out), all-row and all-column majors
      set(file gemm_mma.cu)
      set(arch -arch=sm_90)
      list(APPEND design_flags -DFERRY_VEC=${vec} -DFERRY_WARPS_K=${wk})
      set(kinds "-DFERRY_A_ROW=1 -DFERRY_B_ROW=1" "-DFERRY_A_ROW=0 -DFERRY_B_ROW=0")
    else()
      # gemm_mma_sw.cu and gemm_wgmma.cu in the benchmark's kind (bf16 row-major in and out) and column-major
      # throughout; they sit at the 255-register ceiling, so spills are the thing to watch for. wgmma: sm_90a only.
      if(family STREQUAL "MMA_SW")
        set(file gemm_mma_sw.cu)
        set(arch -arch=sm_90)
      else()
        set(file gemm_wgmma.cu)
        set(arch -gencode=arch=compute_90a,code=sm_90a)
        if(family STREQUAL "WGMMA_PERSISTENT")
          list(APPEND design_flags -DFERRY_PERSISTENT=1)
        elseif(family STREQUAL "WGMMA_TMA")
          list(APPEND design_flags -DFERRY_PERSISTENT=1 -DFERRY_TMA=1)
        elseif(family STREQUAL "WGMMA_TMA_CLUSTER")
          list(APPEND design_flags -DFERRY_PERSISTENT=1 -DFERRY_TMA=1 -DFERRY_CLUSTER=2)
        endif()
      endif()
      list(APPEND design_flags -DFERRY_A_TYPE=2 -DFERRY_OUT_TYPE=2) # bf16
      set(kinds "-DFERRY_A_ROW=1 -DFERRY_B_ROW=1 -DFERRY_OUT_ROW=1" "-DFERRY_A_ROW=0 -DFERRY_B_ROW=0 -DFERRY_OUT_ROW=0")
    endif()
    foreach(majors ${kinds})
      separate_arguments(maj UNIX_COMMAND "${majors}")
      list(APPEND check_cmds COMMAND ${CMAKE_COMMAND} -E echo "${file} ${bm}x${bn}x${bk} s${st} vec${vec} k-sets${wk} ${majors}"
        COMMAND ${FERRY_NVCC} ${arch} -cubin -o ${CMAKE_CURRENT_BINARY_DIR}/check_kernel.cubin -Xptxas -v
                ${design_flags} ${maj} ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/${file})
    endforeach()
  endforeach()
  add_custom_target(ferry_check_kernels ${check_cmds}
    COMMAND ${CMAKE_COMMAND} -E echo "gemm_simt"
    COMMAND ${FERRY_NVCC} -arch=sm_90 -cubin -o ${CMAKE_CURRENT_BINARY_DIR}/check_simt.cubin -Xptxas -v
            ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/gemm_simt.cu
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels VERBATIM
    COMMENT "nvcc -Xptxas -v over ferry's GEMM designs")
endif()

# The tensor-core kernels run on the CPU (tests/kernels/emulate_cuda.h): every gemm_mma_sw design and the
# gemm_wgmma design (both schedules) in seven kinds over edge, batched, alpha/beta and k=0 cases, with gemm_mma.cu
# as the control, and the mutants the emulation must catch. No GPU needed; a C++17 compiler is.
# `cmake --build B --target ferry_emulate_kernels`; also a test.
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
