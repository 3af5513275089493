/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_auth.h — libddp's private authentication helpers: SHA-256, HMAC-SHA256, PBKDF2,
 * constant-time comparison, nonces, and the mutual challenge-response proof every libddp
 * connection uses to show that both ends know the job secret without ever sending it. Nothing
 * public: users never include it. Depends on ddp_base.h. Built by DDP_IMPLEMENTATION (or DDP_AUTH_IMPLEMENTATION).
 *
 * THE HANDSHAKE (what a connection using it does; ddp_store.h is the first user)
 *   K = the key: for the store, the job secret stretched by PBKDF2 (_ddp_auth_job_key); for
 *   data connections, a per-communicator key derived from it. Each side draws a fresh 32-byte
 *   nonce (_ddp_auth_nonce).
 *     accepting side  -> nonce_server
 *     connecting side -> nonce_client, proof_c = HMAC(K, "ddp-auth-v1 client" || label || nonce_server || nonce_client)
 *     accepting side  -> proof_s = HMAC(K, "ddp-auth-v1 server" || label || nonce_client || nonce_server)
 *   Each side checks the other's proof with _ddp_auth_verify (constant time). The label names
 *   the purpose ("store", "tcp:<comm id>:<from>-><to>"), so a proof made for one connection
 *   kind is worthless on another. A captured exchange shows only HMAC outputs over public
 *   nonces (nothing about K short of guessing it), and cannot be replayed: the other side's
 *   nonce is fresh every time. The two role strings have the same length and the nonces a
 *   fixed one, so the label is determined by the message length: no two (role, label, nonces)
 *   give the same HMAC input.
 *
 * RULES: nonces come from getrandom(2) (else /dev/urandom); when neither works
 * _ddp_auth_nonce fails and the caller must fail the connection: never a weak nonce. Key
 * material on the stack is wiped before return.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_AUTH_IMPLEMENTATION)
#define DDP_AUTH_IMPLEMENTATION
#endif
#if defined(DDP_AUTH_IMPLEMENTATION)
#ifndef DDP_BASE_IMPLEMENTATION
#define DDP_BASE_IMPLEMENTATION
#endif
#endif
#include "ddp_base.h"

#if defined(DDP_AUTH_IMPLEMENTATION) && !defined(DDP_AUTH_IMPL_INCLUDED)
#define DDP_AUTH_IMPL_INCLUDED
#ifndef DDP_BASE_IMPL_INCLUDED
#error "libddp: ddp_auth.h's implementation needs ddp_base.h's (define DDP_IMPLEMENTATION)"
#endif

#if defined(__linux__)
#include <sys/syscall.h>
#endif

#define _DDP_SHA256_BYTES 32
#define _DDP_AUTH_NONCE_BYTES 32
#define _DDP_AUTH_PROOF_BYTES 32
enum { _DDP_AUTH_CLIENT = 0, _DDP_AUTH_SERVER = 1 };   /* the role a proof is made for */

/* ---------------------------------------------------------------- SHA-256 (FIPS 180-4) */
typedef struct {
    uint32_t h[8];
    uint64_t bytes;           /* message length so far */
    unsigned char block[64];
    size_t fill;              /* bytes waiting in block */
} _ddp_sha256_t;

/* FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the
 * first 64 primes. */
static const uint32_t _ddp_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

static inline uint32_t _ddp_rotr32(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

/* Wipes memory the compiler may not elide (key material, pads). */
_DDP_PRIVATE void _ddp_auth_wipe(void *p, size_t n) {
    volatile unsigned char *v = (volatile unsigned char *)p;
    while (n--) *v++ = 0;
}

_DDP_PRIVATE void _ddp_sha256_init(_ddp_sha256_t *c) {
    /* FIPS 180-4 section 5.3.3: the fractional parts of the square roots of the first 8 primes. */
    static const uint32_t h0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
    c->fill = 0;
}

/* The compression touches only its arguments and the stack: ThreadSanitizer has nothing to find
 * there and would make PBKDF2 ten times slower (the TSan tests open stores with secrets). */
#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
#define _DDP_AUTH_NO_TSAN __attribute__((no_sanitize("thread")))
#endif
#endif
#ifndef _DDP_AUTH_NO_TSAN
#define _DDP_AUTH_NO_TSAN
#endif

/* FIPS 180-4 section 6.2.2: one 512-bit block. */
static _DDP_AUTH_NO_TSAN void _ddp_sha256_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, hh;
    int t;
    for (t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (t = 16; t < 64; t++) {
        uint32_t s0 = _ddp_rotr32(w[t - 15], 7) ^ _ddp_rotr32(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = _ddp_rotr32(w[t - 2], 17) ^ _ddp_rotr32(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; hh = h[7];
    for (t = 0; t < 64; t++) {
        uint32_t S1 = _ddp_rotr32(e, 6) ^ _ddp_rotr32(e, 11) ^ _ddp_rotr32(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + _ddp_sha256_k[t] + w[t];
        uint32_t S0 = _ddp_rotr32(a, 2) ^ _ddp_rotr32(a, 13) ^ _ddp_rotr32(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
#if defined(__GNUC__) || defined(__clang__)
    memset(w, 0, sizeof w);                       /* one call (PBKDF2 runs this 40,000 times); */
    __asm__ __volatile__("" : : "r"(w) : "memory");   /* the barrier keeps the store */
#else
    _ddp_auth_wipe(w, sizeof w);
#endif
}

_DDP_PRIVATE void _ddp_sha256_update(_ddp_sha256_t *c, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    c->bytes += n;
    if (c->fill) {
        size_t take = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->block + c->fill, p, take);
        c->fill += take; p += take; n -= take;
        if (c->fill < 64) return;
        _ddp_sha256_block(c->h, c->block);
        c->fill = 0;
    }
    for (; n >= 64; p += 64, n -= 64) _ddp_sha256_block(c->h, p);
    if (n) { memcpy(c->block, p, n); c->fill = n; }
}

/* Padding (FIPS 180-4 section 5.1.1): 0x80, zeros, the length in bits as 64-bit big endian. */
_DDP_PRIVATE void _ddp_sha256_final(_ddp_sha256_t *c, unsigned char out[_DDP_SHA256_BYTES]) {
    uint64_t bits = c->bytes * 8;
    int i;
    c->block[c->fill++] = 0x80;
    if (c->fill > 56) {
        memset(c->block + c->fill, 0, 64 - c->fill);
        _ddp_sha256_block(c->h, c->block);
        c->fill = 0;
    }
    memset(c->block + c->fill, 0, 56 - c->fill);
    for (i = 0; i < 8; i++) c->block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    _ddp_sha256_block(c->h, c->block);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
    _ddp_auth_wipe(c, sizeof *c);
}

_DDP_PRIVATE void _ddp_sha256(const void *data, size_t n, unsigned char out[_DDP_SHA256_BYTES]) {
    _ddp_sha256_t c;
    _ddp_sha256_init(&c);
    _ddp_sha256_update(&c, data, n);
    _ddp_sha256_final(&c, out);
}

/* ---------------------------------------------------------------- HMAC-SHA256 (RFC 2104) */
typedef struct { _ddp_sha256_t inner, outer; } _ddp_hmac_sha256_t;

_DDP_PRIVATE void _ddp_hmac_sha256_init(_ddp_hmac_sha256_t *h, const void *key, size_t keylen) {
    unsigned char k[64], pad[64];
    int i;
    memset(k, 0, sizeof k);
    if (keylen > 64) _ddp_sha256(key, keylen, k);     /* keys longer than a block are hashed */
    else if (keylen) memcpy(k, key, keylen);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x36);
    _ddp_sha256_init(&h->inner);
    _ddp_sha256_update(&h->inner, pad, 64);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x5c);
    _ddp_sha256_init(&h->outer);
    _ddp_sha256_update(&h->outer, pad, 64);
    _ddp_auth_wipe(k, sizeof k);
    _ddp_auth_wipe(pad, sizeof pad);
}

_DDP_PRIVATE void _ddp_hmac_sha256_update(_ddp_hmac_sha256_t *h, const void *data, size_t n) {
    _ddp_sha256_update(&h->inner, data, n);
}

_DDP_PRIVATE void _ddp_hmac_sha256_final(_ddp_hmac_sha256_t *h, unsigned char out[_DDP_SHA256_BYTES]) {
    unsigned char ih[_DDP_SHA256_BYTES];
    _ddp_sha256_final(&h->inner, ih);
    _ddp_sha256_update(&h->outer, ih, sizeof ih);
    _ddp_sha256_final(&h->outer, out);
    _ddp_auth_wipe(ih, sizeof ih);
}

_DDP_PRIVATE void _ddp_hmac_sha256(const void *key, size_t keylen, const void *data, size_t n,
                                   unsigned char out[_DDP_SHA256_BYTES]) {
    _ddp_hmac_sha256_t h;
    _ddp_hmac_sha256_init(&h, key, keylen);
    _ddp_hmac_sha256_update(&h, data, n);
    _ddp_hmac_sha256_final(&h, out);
}

/* ---------------------------------------------------------------- PBKDF2-HMAC-SHA256 (RFC 8018)
 * RFC 8018 section 5.2: T_i = U_1 ^ ... ^ U_c, U_1 = PRF(P, S || INT(i)), U_j = PRF(P, U_{j-1}),
 * PRF = HMAC-SHA256; out = T_1 || T_2 || ... truncated to outlen. The key's padded inner and
 * outer states are computed once, so an iteration costs two SHA-256 blocks (what an attacker
 * pays per iteration too: the cost is the iteration count, not our implementation). */
/* The digest words h as 32 big-endian bytes. */
static void _ddp_sha256_words_out(const uint32_t h[8], unsigned char *out) {
    int i;
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(h[i] >> 8);
        out[4 * i + 3] = (unsigned char)h[i];
    }
}

_DDP_PRIVATE _DDP_AUTH_NO_TSAN void _ddp_pbkdf2_sha256(const void *pw, size_t pwlen, const void *salt,
                                                       size_t saltlen, uint32_t iterations,
                                                       unsigned char *out, size_t outlen) {
    /* After U_1, every U_j is HMAC over 32 bytes: one padded block for the inner hash and one for
     * the outer, compressed straight from the key's two saved states (the same values as
     * _ddp_hmac_sha256 over U_{j-1}, without re-padding or copying contexts each time). */
    _ddp_hmac_sha256_t base, h;
    unsigned char u[64], inner[64], t[_DDP_SHA256_BYTES], ctr[4];
    uint32_t st[8], block = 1, j;
    int k;
    _ddp_hmac_sha256_init(&base, pw, pwlen);
    memset(u, 0, sizeof u);
    u[32] = 0x80;
    u[62] = 0x03;                 /* 64 + 32 bytes hashed = 768 bits = 0x300 */
    memcpy(inner, u, sizeof inner);
    while (outlen) {
        size_t take = outlen < sizeof t ? outlen : sizeof t;
        ctr[0] = (unsigned char)(block >> 24); ctr[1] = (unsigned char)(block >> 16);
        ctr[2] = (unsigned char)(block >> 8);  ctr[3] = (unsigned char)block;
        h = base;
        _ddp_hmac_sha256_update(&h, salt, saltlen);
        _ddp_hmac_sha256_update(&h, ctr, sizeof ctr);
        _ddp_hmac_sha256_final(&h, u);            /* U_1 into u[0..31]; the padding stays */
        memcpy(t, u, sizeof t);
        for (j = 1; j < iterations; j++) {
            memcpy(st, base.inner.h, sizeof st);
            _ddp_sha256_block(st, u);
            _ddp_sha256_words_out(st, inner);
            memcpy(st, base.outer.h, sizeof st);
            _ddp_sha256_block(st, inner);
            _ddp_sha256_words_out(st, u);
            for (k = 0; k < _DDP_SHA256_BYTES; k++) t[k] ^= u[k];
        }
        memcpy(out, t, take);
        out += take;
        outlen -= take;
        block++;
    }
    _ddp_auth_wipe(&base, sizeof base);
    _ddp_auth_wipe(&h, sizeof h);
    _ddp_auth_wipe(st, sizeof st);
    _ddp_auth_wipe(u, sizeof u);
    _ddp_auth_wipe(inner, sizeof inner);
    _ddp_auth_wipe(t, sizeof t);
}

/* The key a job's connections prove: the job secret stretched by PBKDF2, so that every guess
 * at a human-chosen secret (online, or offline from a captured handshake) costs
 * _DDP_AUTH_KDF_ITERATIONS HMACs instead of one. The salt is public: the store server draws it
 * at random when it starts and sends it in every challenge, so it binds the key to this job
 * (a dictionary precomputed for one job is useless for the next).
 * The cost, 20,000 iterations: about 9 ms of one core (-O2), paid once per process (a split
 * communicator reuses its parent's store, an async lane copies the key; measured in README
 * "Security"). It makes an offline guess 20,000 times dearer than one HMAC; five times more
 * would add only 2.3 bits, would still not save a dictionary word, and would cost the test
 * suite, which opens a store client with a secret dozens of times per binary, seconds per run.
 * Length is what protects a secret: the store WARNs below 16 characters. */
#ifndef _DDP_AUTH_KDF_ITERATIONS
#define _DDP_AUTH_KDF_ITERATIONS 20000u
#endif
#define _DDP_AUTH_SALT_BYTES 16
_DDP_PRIVATE void _ddp_auth_job_key(const char *secret, size_t len,
                                    const unsigned char salt[_DDP_AUTH_SALT_BYTES],
                                    unsigned char out[_DDP_SHA256_BYTES]) {
    static const char tag[] = "libddp job key v1 ";
    unsigned char s[sizeof tag - 1 + _DDP_AUTH_SALT_BYTES];
    memcpy(s, tag, sizeof tag - 1);
    memcpy(s + sizeof tag - 1, salt, _DDP_AUTH_SALT_BYTES);
    _ddp_pbkdf2_sha256(secret, len, s, sizeof s, _DDP_AUTH_KDF_ITERATIONS, out, _DDP_SHA256_BYTES);
}

/* ---------------------------------------------------------------- comparison, nonces, proofs */
/* 1 if equal. Time depends on n only, never on where the first difference is. */
_DDP_PRIVATE int _ddp_auth_equal(const void *a, const void *b, size_t n) {
    const volatile unsigned char *x = (const volatile unsigned char *)a;
    const volatile unsigned char *y = (const volatile unsigned char *)b;
    unsigned diff = 0;
    size_t i;
    for (i = 0; i < n; i++) diff |= (unsigned)(x[i] ^ y[i]);
    return diff == 0;
}

/* Fills out with n bytes from the kernel's CSPRNG: 0, or -errno (then nothing is usable). */
_DDP_PRIVATE int _ddp_auth_random(void *out, size_t n) {
    unsigned char *p = (unsigned char *)out;
    size_t got = 0;
    int fd;
#if defined(__linux__) && defined(SYS_getrandom)
    while (got < n) {
        long r = syscall(SYS_getrandom, p + got, n - got, 0);
        if (r > 0) { got += (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        break;                 /* ENOSYS (old kernel, seccomp): try the device */
    }
    if (got == n) return 0;
#endif
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r > 0) { got += (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        {
            int e = r < 0 ? errno : EIO;
            close(fd);
            return -e;
        }
    }
    close(fd);
    return 0;
}

_DDP_PRIVATE int _ddp_auth_nonce(unsigned char out[_DDP_AUTH_NONCE_BYTES]) {
    return _ddp_auth_random(out, _DDP_AUTH_NONCE_BYTES);
}

/* The proof `role` sends (see the top of this file): the caller always passes the server's
 * nonce, then the client's; the order inside the HMAC depends on the role. */
_DDP_PRIVATE void _ddp_auth_proof(const void *key, size_t keylen, int role, const char *label,
                                  const unsigned char nonce_server[_DDP_AUTH_NONCE_BYTES],
                                  const unsigned char nonce_client[_DDP_AUTH_NONCE_BYTES],
                                  unsigned char out[_DDP_AUTH_PROOF_BYTES]) {
    static const char client_tag[] = "ddp-auth-v1 client", server_tag[] = "ddp-auth-v1 server";
    _ddp_hmac_sha256_t h;
    _ddp_hmac_sha256_init(&h, key, keylen);
    if (role == _DDP_AUTH_SERVER) {
        _ddp_hmac_sha256_update(&h, server_tag, sizeof server_tag - 1);
        if (label) _ddp_hmac_sha256_update(&h, label, strlen(label));
        _ddp_hmac_sha256_update(&h, nonce_client, _DDP_AUTH_NONCE_BYTES);
        _ddp_hmac_sha256_update(&h, nonce_server, _DDP_AUTH_NONCE_BYTES);
    } else {
        _ddp_hmac_sha256_update(&h, client_tag, sizeof client_tag - 1);
        if (label) _ddp_hmac_sha256_update(&h, label, strlen(label));
        _ddp_hmac_sha256_update(&h, nonce_server, _DDP_AUTH_NONCE_BYTES);
        _ddp_hmac_sha256_update(&h, nonce_client, _DDP_AUTH_NONCE_BYTES);
    }
    _ddp_hmac_sha256_final(&h, out);
}

/* 1 if proof is what `role` must send for these nonces under key. */
_DDP_PRIVATE int _ddp_auth_verify(const void *key, size_t keylen, int role, const char *label,
                                  const unsigned char nonce_server[_DDP_AUTH_NONCE_BYTES],
                                  const unsigned char nonce_client[_DDP_AUTH_NONCE_BYTES],
                                  const unsigned char proof[_DDP_AUTH_PROOF_BYTES]) {
    unsigned char want[_DDP_AUTH_PROOF_BYTES];
    int same;
    _ddp_auth_proof(key, keylen, role, label, nonce_server, nonce_client, want);
    same = _ddp_auth_equal(want, proof, sizeof want);
    _ddp_auth_wipe(want, sizeof want);
    return same;
}

#endif /* DDP_AUTH_IMPLEMENTATION */
