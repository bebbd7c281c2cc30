/* fork.c — what happens to ferry across fork(): a child never hangs on a lock, never reaches a driver or a
 * compiler that cannot work there, and gets a clear error instead; it never sees the pinned pool's pages.
 *
 * CUDA does not survive fork: the child has the parent's memory but not its driver state, and driver calls there
 * fail, hang or corrupt the parent's context depending on the driver. So once ferry has initialised the driver
 * (driver.c arms this guard then), a forked child refuses every call that would reach the driver with
 * FERRY_UNSUPPORTED and a sentence saying why and what to do, and the driver-call macro stops any call that would
 * still be made (a ticket or slab released in the child) before it reaches the driver. NVRTC is refused the same
 * way in a child forked after the parent loaded it (or initialised the driver): another thread may have been
 * compiling at the fork, and NVRTC's internal state is not the child's to trust. Calls that need neither —
 * status names, ferry_ops_count/get/find/supports on an explicit target or FERRY_ARCH, a compile answered by the
 * memo, export and import, the pool's and the caches' counters — work in the child. A process that forks before
 * ferry's first driver call or compile is unaffected, and so is exec after fork.
 *
 * Locks. The handlers are installed when the library is loaded, so that no fork is ever unbracketed. `prepare`
 * takes every lock of the library that a child could reach, in one global order, and the parent and the child
 * release them after, so no child starts with a lock owned by a thread that does not exist there. The order is
 * the order in which the code nests them, outermost first (a thread only ever waits for a lock later in the list
 * than any it holds, so prepare cannot deadlock against it):
 *
 *   1. the registry, then the operators' memo lock (registry.c): the memo lock nests nothing but driver calls
 *   2. the driver's and NVRTC's one-time loads (driver.c, rtc.c): held while loading, so a fork waits for a load
 *      in progress instead of leaving the child a half-initialised library
 *   3. the primary-context lock (device.c), the device-memory pools' (devmem.c), the gather kernel's modules'
 *      (kernels.c): each holds only driver calls
 *   4. the pinned pool's (pinned.c), then the free events' (stream.c): the pool returns events under its lock
 *   5. the compile caches' counters (cache.c): a leaf
 *
 * What is not bracketed, and why the child never waits on it: an artifact's lock (artifacts are not enumerable)
 * is only taken to load the artifact into the driver, after the driver check, so a child refuses before it; the
 * pinned pool's condition variable is only waited on while pinning, which the child refuses. The one-time
 * initialisations (pthread_once: the driver, NVRTC, the built-in operators) run their bodies under the locks
 * above, so at the fork none is past its lock; one that another thread had entered and that waits on the lock is
 * run again by the child (glibc keys once controls to the fork generation). This holds only while no user code
 * (a supports callback, a filter, a Python object) runs under any of these locks — the library's rule: code that
 * waited there for something the forking thread holds, or forked itself, would deadlock prepare.
 *
 * Pinned memory. The pool's regions are marked MADV_DONTFORK (pinned.c): a child does not inherit them, so a fork
 * never copies the pool (the kernel copies pinned pages eagerly into a child: gigabytes per worker otherwise), and
 * the child, which could not use them with CUDA anyway, never unregisters, unmaps or writes them. In the child the
 * regions' address ranges stay reserved and inaccessible, so an output that viewed a slab faults when read (never
 * reads whatever the child mapped there later). Copy what a child needs out of ferry's outputs before forking.
 */
#include "internal.h"

#include <unistd.h>

volatile int ferry__fork_child;
volatile int ferry__fork_no_rtc;
static pid_t driver_in, rtc_in; /* the process that initialised the driver / loaded NVRTC; 0 before */

static void prepare(void) {
  ferry__registry_fork_lock(1);
  ferry__driver_fork_lock(1);
  ferry__rtc_fork_lock(1);
  ferry__device_fork_lock(1);
  ferry__devmem_fork_lock(1);
  ferry__gather_fork_lock(1);
  ferry__pool_fork_lock(1);
  ferry__events_fork_lock(1);
  ferry__cache_fork_lock(1);
  ferry__slab_fork_lock(1);
}

static void release_all(void) {
  ferry__slab_fork_lock(0);
  ferry__cache_fork_lock(0);
  ferry__events_fork_lock(0);
  ferry__pool_fork_lock(0);
  ferry__gather_fork_lock(0);
  ferry__devmem_fork_lock(0);
  ferry__device_fork_lock(0);
  ferry__rtc_fork_lock(0);
  ferry__driver_fork_lock(0);
  ferry__registry_fork_lock(0);
}

static void in_child(void) {
  ferry__pool_fork_child(); /* under the pool's lock, still held from prepare */
  release_all();
  if (driver_in) {
    ferry__fork_child = 1;
    ferry__fault_armed = 1; /* every FERRY_CU now consults ferry__fault_check, which refuses while forked */
  }
  if (driver_in || rtc_in) ferry__fork_no_rtc = 1;
}

__attribute__((constructor)) static void install(void) { (void)pthread_atfork(prepare, release_all, in_child); }

void ferry__fork_guard_install(void) {
  if (!driver_in) driver_in = getpid();
}

void ferry__fork_guard_install_rtc(void) {
  if (!rtc_in) rtc_in = getpid();
}

ferry_status ferry__fork_refuse(void) {
  pid_t in = driver_in ? driver_in : rtc_in;
  return FERRY_ERR(FERRY_UNSUPPORTED, "CUDA cannot be used in a child forked after the parent initialised it "
                   "(ferry initialised %s in process %d; this is process %d): use ferry in the parent, or start "
                   "workers that need the GPU or the compiler with spawn or forkserver (posix_spawn, fork+exec) "
                   "instead of a bare fork", driver_in ? "the driver" : "NVRTC", (int)in, (int)getpid());
}
