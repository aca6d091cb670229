/*
 * engine/crc32c.c — CRC32C (Castagnoli, reflected polynomial 0x82F63B78),
 * the per-extent checksum of the engine.
 *
 * On x86-64 with SSE4.2 the crc32 instruction does 8 bytes per step (several
 * GB/s on one core, so checking every read costs little next to the disk);
 * elsewhere, or on a CPU without it, a slicing-by-8 table does the same
 * computation in software.  The choice is made once, at the first call.
 * Conventions as in iSCSI/ext4/RocksDB: initial value ~0, final xor ~0, so
 * tio_crc32c(0, "123456789", 9) == 0xE3069283 (the standard check value).
 */
#include <pthread.h>
#include <string.h>

#include "engine/engine_internal.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

static uint32_t table[8][256];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static bool have_hw;

static void init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t c, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
        n--;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
            table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^
            table[2][(w >> 40) & 0xFF] ^ table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
    }
    while (n--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p,
                                                          size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
    uint64_t c64 = c;
    for (; n >= 32; n -= 32, p += 32) {
        uint64_t w[4];
        memcpy(w, p, 32);
        c64 = _mm_crc32_u64(c64, w[0]);
        c64 = _mm_crc32_u64(c64, w[1]);
        c64 = _mm_crc32_u64(c64, w[2]);
        c64 = _mm_crc32_u64(c64, w[3]);
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
    }
    c = (uint32_t)c64;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

uint32_t tio_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&init_once, init_tables);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (have_hw)
        return ~crc_hw(c, data, n);
#endif
    return ~crc_sw(c, data, n);
}

uint32_t tio_crc32c_sw(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&init_once, init_tables);
    return ~crc_sw(~crc, data, n);
}
