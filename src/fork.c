/* fork.c — what happens to ferry across fork(): the child of a process that initialised CUDA gets a clear error
 * instead of a hang or a crash, and ferry's locks are never inherited held.
 *
 * CUDA does not survive fork: the child has the parent's memory but not its driver state, and driver calls there
 * fail, hang or corrupt the parent's context depending on the driver. So once ferry has initialised the driver
 * (driver.c installs this guard then), a forked child refuses every call that would reach the driver with
 * FERRY_UNSUPPORTED and a sentence saying why and what to do, and the driver-call macro stops any call that
 * would still be made (a ticket or slab released in the child) before it reaches the driver. The child never
 * unregisters, unmaps or writes the pool's pinned memory: those paths all pass through the refusal. A process that
 * forks before ferry's first driver call is unaffected, and so is exec after fork.
 *
 * pthread_atfork also brackets the fork with ferry's own locks: held by the forking thread in `prepare`, released
 * on both sides after, so no child starts with a lock owned by a thread that does not exist there (which would
 * hang its first ferry_pool_stats_get or release).
 */
#include "internal.h"

#include <unistd.h>

volatile int ferry__fork_child;
static pid_t initialised_in; /* the process that initialised the driver */

/* Lock order as the library nests them: the context lock, then the pool's, then the event list's (the pool
 * returns events while holding its lock). */
static void prepare(void) {
  ferry__device_fork_lock(1);
  ferry__pool_fork_lock(1);
  ferry__events_fork_lock(1);
}

static void release_all(void) {
  ferry__events_fork_lock(0);
  ferry__pool_fork_lock(0);
  ferry__device_fork_lock(0);
}

static void in_child(void) {
  release_all();
  ferry__fork_child = 1;
  ferry__fault_armed = 1; /* every FERRY_CU now consults ferry__fault_check, which refuses while forked */
}

void ferry__fork_guard_install(void) {
  initialised_in = getpid();
  (void)pthread_atfork(prepare, release_all, in_child);
}

ferry_status ferry__fork_refuse(void) {
  return FERRY_ERR(FERRY_UNSUPPORTED, "CUDA cannot be used in a child forked after the parent initialised it "
                   "(ferry initialised the driver in process %d; this is process %d): use ferry in the parent, or "
                   "start workers that need the GPU with spawn or forkserver (posix_spawn, fork+exec) instead of a "
                   "bare fork", (int)initialised_in, (int)getpid());
}
