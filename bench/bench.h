/* bench.h — the `ferry bench ...` subcommands; each is a program of its own with --help, defaults that run as
 * they are, CSV output and a compact table last. Without a GPU each says so and returns 0. */
#ifndef FERRY_BENCH_H
#define FERRY_BENCH_H

int bench_bandwidth_main(int argc, char **argv); /* D2H/H2D over sizes and tensor counts vs the raw copies */
int bench_overlap_main(int argc, char **argv);   /* SPDL's transfer/compute overlap experiment, in C */
int bench_ranks_main(int argc, char **argv);     /* one process per GPU under torchrun: placement, aggregate GB/s */
int bench_latency_main(int argc, char **argv);   /* operator host latency: the CUTLASS notebook's table, in C */

#endif
