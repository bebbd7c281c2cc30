/* latency.c — placeholder while being written */
#include "bench.h"
#include "common.h"
int bench_latency_main(int argc, char **argv) { (void)argc; (void)argv; return 0; }
