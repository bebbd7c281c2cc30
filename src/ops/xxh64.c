/* xxh64.c — XXH64, a fast 64-bit non-cryptographic hash, for the artifact files' content check.
 *
 * Written from the xxHash specification (XXH64: four 64-bit lanes over 32-byte stripes, each lane
 * acc = rotl(acc + lane * P2, 31) * P1; the lanes merged, the tail of 8-, 4- and 1-byte pieces folded in, then an
 * avalanche of shifts and multiplies). It runs at several GB/s where ferry's SHA-256 manages ~0.2 GB/s, and its
 * values match every other XXH64 (the tests check the published ones), so a file can be checked by other tools.
 *
 * Why a non-cryptographic hash is enough: the check defends against damage — a truncated or torn write, a flipped
 * bit, a file of another format or version — not against an attacker. The disk cache's directory is refused
 * unless it is the user's own and writable by no one else (cache.c), and an imported file is one the user chose;
 * whoever can rewrite those files can already run code as the user, and a SHA-256 beside the content would not
 * stop them either (they would recompute it). Which file answers which compile is decided by the SHA-256 key.
 *
 * Why not the system's libxxhash: libferry's only run-time dependencies are libc and the driver and NVRTC it loads
 * itself, and the artifact format fixes the algorithm, so eighty lines here are cheaper than a shared library that
 * is often absent. The tests check it against the reference's sanity-check vectors (tests/cpu/test_ops_compile.c).
 */
#include "ops.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Little-endian loads whatever the host's order or the pointer's alignment. memcpy compiles to one load (a loop
 * of byte shifts is not merged into one at -O2, and ran the hash at a fifth of its speed). */
static inline uint64_t load64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}
static inline uint32_t load32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

static inline uint64_t round64(uint64_t acc, uint64_t lane) { return rotl(acc + lane * P2, 31) * P1; }

static inline uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }

uint64_t ferry__xxh64(const void *data, size_t n, uint64_t seed) {
  const unsigned char *p = data, *end = p + n;
  uint64_t acc;
  if (n >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const unsigned char *last_stripe = end - 32;
    for (; p <= last_stripe; p += 32) {
      v1 = round64(v1, load64(p));
      v2 = round64(v2, load64(p + 8));
      v3 = round64(v3, load64(p + 16));
      v4 = round64(v4, load64(p + 24));
    }
    acc = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    acc = merge(acc, v1);
    acc = merge(acc, v2);
    acc = merge(acc, v3);
    acc = merge(acc, v4);
  } else {
    acc = seed + P5;
  }
  acc += (uint64_t)n;
  for (; end - p >= 8; p += 8) acc = rotl(acc ^ round64(0, load64(p)), 27) * P1 + P4;
  if (end - p >= 4) {
    acc = rotl(acc ^ (uint64_t)load32(p) * P1, 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; p++) acc = rotl(acc ^ (uint64_t)*p * P5, 11) * P1;
  acc ^= acc >> 33;
  acc *= P2;
  acc ^= acc >> 29;
  acc *= P3;
  acc ^= acc >> 32;
  return acc;
}
