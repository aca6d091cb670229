/*
 * data/perm.c — the keyed bijection behind shuffling without a build step,
 * a 64-bit mixer and CRC-32.
 *
 * tio_permute(i, n, key) maps [0, n) onto itself one-to-one: a balanced
 * Feistel network over the smallest even number of bits 2h with 2^(2h) >= n
 * (a bijection on [0, 4^h) for any round function), restricted to [0, n) by
 * cycle walking (re-encrypt until the value falls inside; terminates because
 * the orbit of i returns to i, and takes < 4 steps on average since 4^h < 4n).
 * Black & Rogaway, "Ciphers with Arbitrary Finite Domains", CT-RSA 2002.
 * The only state a shuffled stream needs is the counter i.
 */
#include "data/data_internal.h"
#include "teraio_config.h"

#if TIO_HAVE_ZLIB
#include <zlib.h>
#endif

uint64_t tio_mix64(uint64_t x)
{
    /* splitmix64 finalizer (Steele, Lea, Flood 2014) */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t feistel(uint64_t x, unsigned h, uint64_t key)
{
    uint64_t mask = (h == 64) ? ~0ull : ((1ull << h) - 1);
    uint64_t l = x >> h, r = x & mask;
    for (unsigned round = 0; round < 4; round++) {
        uint64_t f = tio_mix64(key ^ (r * 0xD6E8FEB86659FD93ull) ^ round) & mask;
        uint64_t t = l ^ f;
        l = r;
        r = t;
    }
    return (l << h) | r;
}

uint64_t tio_permute(uint64_t i, uint64_t n, uint64_t key)
{
    if (n <= 1)
        return 0;
    unsigned bits = 64 - (unsigned)__builtin_clzll(n - 1);
    unsigned h = (bits + 1) / 2;
    if (h > 31)
        h = 31; /* domains past 2^62 are not used: documents per range fit */
    uint64_t x = i;
    do
        x = feistel(x, h, key);
    while (x >= n);
    return x;
}

#if !TIO_HAVE_ZLIB
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t k = 0; k < 256; k++) {
        uint32_t c = k;
        for (int j = 0; j < 8; j++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[k] = c;
    }
}
#endif

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32): zlib's own when built
 * with it (several times faster), else a byte-wise table. */
uint32_t tio_crc32(const void *data, size_t len)
{
#if TIO_HAVE_ZLIB
    uLong c = crc32(0L, Z_NULL, 0);
    const Bytef *b = data;
    while (len) {
        uInt k = len > (1u << 30) ? 1u << 30 : (uInt)len;
        c = crc32(c, b, k);
        b += k;
        len -= k;
    }
    return (uint32_t)c;
#else
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
#endif
}
