# cases.cmake — the `ferry` program's command line, one ctest per behaviour (tests/cli/check_cli.cmake runs each).
# They need no GPU: every case either stops at the command line, or runs where no device is visible, where each
# command says so and exits 0. Exit status: 0 done, 1 a failure, 2 a bad command line.

# cli_test(NAME STATUS STREAM REGEX ARG...) — `ferry ARG...` exits with STATUS and prints REGEX on STREAM.
function(cli_test name status stream regex)
  add_test(NAME cli_${name} COMMAND ${CMAKE_COMMAND} -DCLI=$<TARGET_FILE:ferry_cli>
    -DWORK=${CMAKE_CURRENT_BINARY_DIR}/cli_check/${name} "-DARGS=${ARGN}" -DRC=${status} -DSTREAM=${stream}
    "-DMATCH=${regex}" "-DABSENT=${cli_absent}" -P ${CMAKE_CURRENT_SOURCE_DIR}/tests/cli/check_cli.cmake)
endfunction()

set(cli_absent "")
cli_test(help_lists_the_commands 0 stdout "usage: ferry.*info.*bench overlap.*bench latency" --help)
cli_test(version_prints_the_library_version 0 stdout "^ferry ${PROJECT_VERSION}\n$" --version)
cli_test(no_command_is_a_usage_error 2 stderr "^usage: ferry")
cli_test(unknown_command_is_a_usage_error 2 stderr "^ferry: unknown command 'frobnicate'" frobnicate)
cli_test(bench_help_lists_the_benchmarks 0 stdout "overlap.*bandwidth.*ranks.*latency" bench --help)
cli_test(bench_without_a_name_lists_the_benchmarks 2 stderr "^ferry: bench: name a benchmark.*overlap.*latency"
  bench)
cli_test(bench_unknown_name_is_a_usage_error 2 stderr "^ferry: bench: unknown benchmark 'nope'.*overlap" bench nope)
cli_test(info_help 0 stdout "^usage: ferry info" info --help)
cli_test(info_rejects_an_unknown_flag 2 stderr "^ferry: info: unknown argument '--verbose'" info --verbose)
cli_test(info_without_a_gpu_says_so 0 stdout "no GPU here" info)

foreach(b overlap bandwidth ranks latency)
  cli_test(${b}_help 0 stdout "^usage: .*ferry bench ${b}" bench ${b} --help)
  cli_test(${b}_rejects_an_unknown_argument 2 stderr "^ferry: bench ${b}: unknown argument '--bogus'"
    bench ${b} --bogus)
  cli_test(${b}_output_under_a_file_fails_first 2 stderr "^ferry: --output .*a_file/out.csv cannot be written"
    bench ${b} --output %FILE%/out.csv)
  cli_test(${b}_output_that_is_a_directory_fails_first 2 stderr "^ferry: --output .* cannot be written: it is a directory"
    bench ${b} --output %WORK%)
  set(cli_absent "%WORK%/out.csv")
  cli_test(${b}_without_a_gpu_says_so_and_writes_nothing 0 stdout "ferry bench ${b}: no GPU here"
    bench ${b} --output %WORK%/out.csv)
  set(cli_absent "")
endforeach()
foreach(b overlap bandwidth)
  cli_test(${b}_rejects_a_malformed_device 2 stderr "^ferry: --device expects a CUDA device .*got 'gpu3'"
    bench ${b} --device gpu3)
  cli_test(${b}_option_without_its_value 2 stderr "^ferry: bench ${b}: --device needs a value" bench ${b} --device)
endforeach()
cli_test(overlap_rejects_a_17th_count 2 stderr "^ferry: bench overlap: --num-tensors takes at most 16 values"
  bench overlap --num-tensors 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17)
cli_test(bandwidth_rejects_a_17th_size 2 stderr "^ferry: bench bandwidth: --sizes takes at most 16 values"
  bench bandwidth --sizes 1K 2K 3K 4K 5K 6K 7K 8K 9K 10K 11K 12K 13K 14K 15K 16K 17K)
cli_test(overlap_rejects_more_tensors_than_bytes 2 stderr "^ferry: bench overlap: cannot split 1 MiB into"
  bench overlap --total-mib 1 --num-tensors 2000000)
cli_test(overlap_samples_output_is_checked_first 2 stderr "^ferry: --samples-output .* cannot be written"
  bench overlap --samples-output %FILE%/s.csv)
cli_test(bandwidth_rejects_a_malformed_size 2 stderr "^ferry: bench bandwidth: --sizes expects sizes like"
  bench bandwidth --sizes 64Q)
cli_test(latency_rejects_too_many_iterations 2 stderr "^ferry: bench latency: --iters \\+ --warmup must be at most"
  bench latency --iters 100 --warmup 20)
cli_test(latency_rejects_a_count_past_its_operand_sets 2 stderr "^ferry: --warmup expects an integer from 0 to 109"
  bench latency --warmup 2147483648)
cli_test(bandwidth_rejects_a_size_under_a_byte 2 stderr "^ferry: bench bandwidth: --sizes expects sizes like"
  bench bandwidth --sizes 0.1)
cli_test(bandwidth_rejects_a_size_past_4_eib 2 stderr "^ferry: bench bandwidth: --sizes expects sizes like"
  bench bandwidth --sizes 1e300G)
cli_test(bandwidth_rejects_repeats_past_an_int 2 stderr "^ferry: --repeats expects an integer from 1 to 2147483647"
  bench bandwidth --repeats 4294967296)
cli_test(overlap_rejects_a_payload_whose_bytes_overflow 2 stderr "^ferry: --total-mib expects an integer from 1 to"
  bench overlap --total-mib 17592186044417 --num-tensors 2)
# Output that cannot be written is a failure (exit 1 with a message), not a silent success.
if(EXISTS /dev/full)
  add_test(NAME cli_help_to_a_full_device_fails
    COMMAND sh -c "$<TARGET_FILE:ferry_cli> --help > /dev/full 2> \"$1\"; rc=$?; grep -q 'writing to standard output failed' \"$1\" && test $rc -eq 1"
    sh ${CMAKE_CURRENT_BINARY_DIR}/cli_help_to_a_full_device.err)
endif()
