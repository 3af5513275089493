/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/test_auth.c — ddp_auth.h: SHA-256, HMAC-SHA256, constant-time comparison, nonces and
 * the challenge-response proofs every libddp connection uses. Prints TAP.
 *
 *   build/test_auth
 *
 * - SHA-256 against the FIPS 180-4 examples (NIST CSRC "SHA256.pdf": "abc", the 448-bit
 *   "abcdbcde...nopq") and the well-known vectors for "" and one million 'a'.
 * - HMAC-SHA256 against RFC 4231 section 4, test cases 1-7 (case 5 compared on its first 128
 *   bits, as the RFC truncates it).
 * - Incremental updates split at every point of a 200-byte message (and in 1..130-byte
 *   pieces), SHA-256 and HMAC, equal the one-shot result; messages of 0..130 bytes around the
 *   padding boundaries (55, 56, 63, 64) hash identically in one or two pieces.
 * - _ddp_auth_equal: equal/unequal buffers, a difference in the first or the last byte.
 * - _ddp_auth_nonce: succeeds, fills all 32 bytes, never repeats in 1000 draws.
 * - proofs: HMAC over exactly "ddp-auth-v1 client" || label || nonce_s || nonce_c (server:
 *   "... server" || label || nonce_c || nonce_s); each side's verify accepts the other's; a
 *   wrong key, swapped nonces, another nonce, another label, the other role, or an empty key
 *   gives a different proof; a proof that differs in one bit is refused.
 * - PBKDF2-HMAC-SHA256 (RFC 8018) against RFC 7914 section 11's two vectors ("passwd"/"salt",
 *   1 iteration, and "Password"/"NaCl", 80,000 iterations, 64 bytes each: two blocks), and a
 *   40-byte output (a partial second block) with an 80-byte salt checked against Python's
 *   hashlib.pbkdf2_hmac; the job key is PBKDF2 with 20,000 iterations over the salt
 *   "libddp job key v1 " || the store's 16-byte random salt, 32 bytes (value from hashlib),
 *   and another salt gives another key. The job key's cost is printed as a diagnostic.
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_auth.h"
#include "tests/ddp_test.h"

static void hex(const unsigned char *p, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) { out[2 * i] = digits[p[i] >> 4]; out[2 * i + 1] = digits[p[i] & 15]; }
    out[2 * n] = 0;
}

static int sha_is(const void *msg, size_t n, const char *want) {
    unsigned char d[32];
    char h[65];
    _ddp_sha256(msg, n, d);
    hex(d, 32, h);
    return strcmp(h, want) == 0;
}

static void sha256_vectors(void) {
    static const char two_block[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    char *million = (char *)malloc(1000000);
    _ddp_sha256_t c;
    unsigned char d[32];
    char h[65];
    int i;
    ok(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
       "SHA-256(\"abc\") (FIPS 180-4 example, one block)");
    ok(sha_is(two_block, strlen(two_block), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
       "SHA-256 of the 448-bit \"abcdbcde...nopq\" (FIPS 180-4 example, two blocks)");
    ok(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "SHA-256(\"\")");
    if (!million) t_bail("malloc");
    memset(million, 'a', 1000000);
    ok(sha_is(million, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
       "SHA-256 of one million 'a' (one shot)");
    _ddp_sha256_init(&c);
    for (i = 0; i < 1000000; i += 1000) _ddp_sha256_update(&c, million + i, 1000);
    _ddp_sha256_final(&c, d);
    hex(d, 32, h);
    ok(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
       "SHA-256 of one million 'a' in 1000 updates of 1000 bytes");
    free(million);
}

/* RFC 4231 section 4: HMAC-SHA256 test cases 1-7. */
typedef struct { const char *key; size_t keylen; const char *data; size_t datalen; const char *mac; size_t maclen; } hmac_case_t;

static void hmac_vectors(void) {
    unsigned char k20b[20], k20a[20], k25[25], k20c[20], k131[131], d50d[50], d50c[50];
    static const char case6[] = "Test Using Larger Than Block-Size Key - Hash Key First";
    static const char case7[] = "This is a test using a larger than block-size key and a larger than block-size data. "
                                "The key needs to be hashed before being used by the HMAC algorithm.";
    hmac_case_t cases[7];
    int i;
    memset(k20b, 0x0b, sizeof k20b);
    memset(k20a, 0xaa, sizeof k20a);
    for (i = 0; i < 25; i++) k25[i] = (unsigned char)(i + 1);
    memset(k20c, 0x0c, sizeof k20c);
    memset(k131, 0xaa, sizeof k131);
    memset(d50d, 0xdd, sizeof d50d);
    memset(d50c, 0xcd, sizeof d50c);
#define HC(i, k, kl, d, dl, m, ml) do { cases[i].key = (const char *)(k); cases[i].keylen = kl; cases[i].data = (const char *)(d); \
                                        cases[i].datalen = dl; cases[i].mac = m; cases[i].maclen = ml; } while (0)
    HC(0, k20b, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32);
    HC(1, "Jefe", 4, "what do ya want for nothing?", 28, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32);
    HC(2, k20a, 20, d50d, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32);
    HC(3, k25, 25, d50c, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32);
    HC(4, k20c, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b", 16);
    HC(5, k131, 131, case6, strlen(case6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32);
    HC(6, k131, 131, case7, strlen(case7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 32);
#undef HC
    for (i = 0; i < 7; i++) {
        unsigned char mac[32];
        char h[65];
        _ddp_hmac_sha256(cases[i].key, cases[i].keylen, cases[i].data, cases[i].datalen, mac);
        hex(mac, cases[i].maclen, h);
        ok(!strcmp(h, cases[i].mac), "HMAC-SHA256, RFC 4231 test case %d%s (key %zu bytes, data %zu bytes): %s", i + 1,
           i == 4 ? " (first 128 bits)" : "", cases[i].keylen, cases[i].datalen, h);
    }
}

static void incremental(void) {
    unsigned char msg[200], one[32], two[32];
    static const char key[] = "a key of some length";
    int split, bad = 0, n, piece;
    for (n = 0; n < 200; n++) msg[n] = (unsigned char)(n * 31 + 7);
    _ddp_sha256(msg, sizeof msg, one);
    for (split = 0; split <= 200; split++) {
        _ddp_sha256_t c;
        _ddp_sha256_init(&c);
        _ddp_sha256_update(&c, msg, (size_t)split);
        _ddp_sha256_update(&c, msg + split, (size_t)(200 - split));
        _ddp_sha256_final(&c, two);
        if (memcmp(one, two, 32)) bad++;
    }
    ok(bad == 0, "SHA-256: two updates split at every point 0..200 equal the one-shot hash (%d differ)", bad);
    for (piece = 1, bad = 0; piece <= 130; piece++) {
        _ddp_sha256_t c;
        int off;
        _ddp_sha256_init(&c);
        for (off = 0; off < 200; off += piece) _ddp_sha256_update(&c, msg + off, (size_t)(off + piece > 200 ? 200 - off : piece));
        _ddp_sha256_final(&c, two);
        if (memcmp(one, two, 32)) bad++;
    }
    ok(bad == 0, "SHA-256: updates in pieces of 1..130 bytes equal the one-shot hash (%d differ)", bad);
    for (n = 0, bad = 0; n <= 130; n++) {   /* around the padding boundaries 55/56/63/64 */
        _ddp_sha256_t c;
        _ddp_sha256(msg, (size_t)n, one);
        _ddp_sha256_init(&c);
        _ddp_sha256_update(&c, msg, (size_t)n / 3);
        _ddp_sha256_update(&c, msg + n / 3, (size_t)(n - n / 3));
        _ddp_sha256_final(&c, two);
        if (memcmp(one, two, 32)) bad++;
    }
    ok(bad == 0, "SHA-256: messages of 0..130 bytes hash the same in one or two pieces (%d differ)", bad);
    _ddp_hmac_sha256(key, strlen(key), msg, sizeof msg, one);
    for (split = 0, bad = 0; split <= 200; split += 7) {
        _ddp_hmac_sha256_t h;
        _ddp_hmac_sha256_init(&h, key, strlen(key));
        _ddp_hmac_sha256_update(&h, msg, (size_t)split);
        _ddp_hmac_sha256_update(&h, msg + split, (size_t)(200 - split));
        _ddp_hmac_sha256_final(&h, two);
        if (memcmp(one, two, 32)) bad++;
    }
    ok(bad == 0, "HMAC-SHA256: two updates at odd split points equal the one-shot MAC (%d differ)", bad);
}

static void equal_and_nonce(void) {
    unsigned char a[32], b[32], n[1000][32];
    int i, j, dup = 0, zero_tail = 0;
    for (i = 0; i < 32; i++) a[i] = b[i] = (unsigned char)i;
    ok(_ddp_auth_equal(a, b, 32), "_ddp_auth_equal: equal buffers");
    ok(_ddp_auth_equal(a, b, 0), "_ddp_auth_equal: empty buffers are equal");
    b[0] ^= 1;
    ok(!_ddp_auth_equal(a, b, 32), "_ddp_auth_equal: first byte differs");
    b[0] ^= 1; b[31] ^= 0x80;
    ok(!_ddp_auth_equal(a, b, 32), "_ddp_auth_equal: last byte differs");
    for (i = 0; i < 1000; i++) {
        memset(n[i], 0, 32);
        if (_ddp_auth_nonce(n[i]) != 0) break;
        if (!n[i][28] && !n[i][29] && !n[i][30] && !n[i][31]) zero_tail++;
    }
    ok(i == 1000, "_ddp_auth_nonce succeeds 1000 times");
    for (i = 0; i < 1000 && !dup; i++)
        for (j = 0; j < i; j++) if (!memcmp(n[i], n[j], 32)) { dup = 1; break; }
    ok(!dup, "1000 nonces are all different");
    ok(zero_tail < 3, "nonces fill all 32 bytes (%d of 1000 end in 4 zero bytes)", zero_tail);
}

static void proofs(void) {
    static const char key[] = "job-secret-123", other[] = "job-secret-124";
    unsigned char ns[32], nc[32], ns2[32], pc[32], ps[32], x[32], want[32];
    const size_t kl = strlen(key);
    int i;
    for (i = 0; i < 32; i++) { ns[i] = (unsigned char)(i + 1); nc[i] = (unsigned char)(0xa0 + i); ns2[i] = ns[i]; }
    ns2[17] ^= 1;
    _ddp_auth_proof(key, kl, _DDP_AUTH_CLIENT, "store", ns, nc, pc);
    _ddp_auth_proof(key, kl, _DDP_AUTH_SERVER, "store", ns, nc, ps);
    {   /* the definition, spelled out */
        unsigned char m[18 + 5 + 64];
        memcpy(m, "ddp-auth-v1 client", 18); memcpy(m + 18, "store", 5); memcpy(m + 23, ns, 32); memcpy(m + 55, nc, 32);
        _ddp_hmac_sha256(key, kl, m, sizeof m, want);
        ok(!memcmp(pc, want, 32), "client proof = HMAC(K, \"ddp-auth-v1 client\" || label || nonce_server || nonce_client)");
        memcpy(m, "ddp-auth-v1 server", 18); memcpy(m + 23, nc, 32); memcpy(m + 55, ns, 32);
        _ddp_hmac_sha256(key, kl, m, sizeof m, want);
        ok(!memcmp(ps, want, 32), "server proof = HMAC(K, \"ddp-auth-v1 server\" || label || nonce_client || nonce_server)");
    }
    ok(_ddp_auth_verify(key, kl, _DDP_AUTH_CLIENT, "store", ns, nc, pc), "the server accepts the client's proof");
    ok(_ddp_auth_verify(key, kl, _DDP_AUTH_SERVER, "store", ns, nc, ps), "the client accepts the server's proof");
    ok(memcmp(pc, ps, 32) != 0, "client and server proofs differ (no reflection)");
    ok(!_ddp_auth_verify(key, kl, _DDP_AUTH_SERVER, "store", ns, nc, pc), "a client proof is refused as a server proof");
    ok(!_ddp_auth_verify(other, strlen(other), _DDP_AUTH_CLIENT, "store", ns, nc, pc), "wrong key -> refused");
    _ddp_auth_proof(other, strlen(other), _DDP_AUTH_CLIENT, "store", ns, nc, x);
    ok(memcmp(x, pc, 32) != 0, "wrong key -> another proof");
    _ddp_auth_proof(key, kl, _DDP_AUTH_CLIENT, "store", nc, ns, x);
    ok(memcmp(x, pc, 32) != 0, "swapped nonces -> another proof");
    _ddp_auth_proof(key, kl, _DDP_AUTH_SERVER, "store", nc, ns, x);
    ok(memcmp(x, ps, 32) != 0 && memcmp(x, pc, 32) != 0, "server proof with swapped nonces differs from both proofs");
    _ddp_auth_proof(key, kl, _DDP_AUTH_CLIENT, "store", ns2, nc, x);
    ok(memcmp(x, pc, 32) != 0, "a fresh server nonce (one bit) -> another proof: no replay");
    _ddp_auth_proof(key, kl, _DDP_AUTH_CLIENT, "tcp:1234:0->1", ns, nc, x);
    ok(memcmp(x, pc, 32) != 0, "another label -> another proof");
    ok(!_ddp_auth_verify(key, kl, _DDP_AUTH_CLIENT, "stor", ns, nc, pc), "a prefix of the label -> refused");
    _ddp_auth_proof("", 0, _DDP_AUTH_CLIENT, "store", ns, nc, x);
    ok(memcmp(x, pc, 32) != 0, "empty key -> another proof");
    _ddp_auth_proof(key, kl, _DDP_AUTH_CLIENT, "store", ns, nc, x);
    ok(!memcmp(x, pc, 32), "the proof is deterministic for the same inputs");
    for (i = 0; i < 256; i++) {
        memcpy(x, pc, 32);
        x[i / 8] ^= (unsigned char)(1u << (i % 8));
        if (_ddp_auth_verify(key, kl, _DDP_AUTH_CLIENT, "store", ns, nc, x)) break;
    }
    ok(i == 256, "every one-bit change of a proof is refused");
}

static void pbkdf2(void) {
    unsigned char out[64], salt[80];
    char h[129];
    double t0;
    int i;
    _ddp_pbkdf2_sha256("passwd", 6, "salt", 4, 1, out, 64);
    hex(out, 64, h);
    ok(!strcmp(h, "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
                  "49ca9cccf179b645991664b39d77ef317c71b845b1e30bd509112041d3a19783"),
       "PBKDF2-HMAC-SHA256(\"passwd\", \"salt\", 1, 64) (RFC 7914 section 11)");
    _ddp_pbkdf2_sha256("Password", 8, "NaCl", 4, 80000, out, 64);
    hex(out, 64, h);
    ok(!strcmp(h, "4ddcd8f60b98be21830cee5ef22701f9641a4418d04c0414aeff08876b34ab56"
                  "a1d425a1225833549adb841b51c9b3176a272bdebba1d078478f62b397f33c8d"),
       "PBKDF2-HMAC-SHA256(\"Password\", \"NaCl\", 80000, 64) (RFC 7914 section 11)");
    for (i = 0; i < 80; i++) salt[i] = (unsigned char)"salt"[i % 4];
    _ddp_pbkdf2_sha256("pw", 2, salt, sizeof salt, 3, out, 40);
    hex(out, 40, h);
    ok(!strcmp(h, "ff3f76ac351c12a224c057dc9cce52932b100760bad442f5016b3ef8dc77a490499d5cb6b55aea65"),
       "PBKDF2-HMAC-SHA256: 40 bytes (a partial second block), 80-byte salt, 3 iterations (hashlib)");
    for (i = 0; i < 16; i++) salt[i] = (unsigned char)i;
    t0 = t_now();
    _ddp_auth_job_key("correct horse", 13, salt, out);
    diag("job key: PBKDF2-HMAC-SHA256, %u iterations: %.1f ms", (unsigned)_DDP_AUTH_KDF_ITERATIONS,
         (t_now() - t0) * 1e3);
    hex(out, 32, h);
    ok(!strcmp(h, "953a871e0edf5e505d27284b567a95990b11d9742a9271a4fd9e69f86b3e4710"),
       "job key = PBKDF2(secret, \"libddp job key v1 \" || salt, 20000 iterations, 32 bytes) (hashlib)");
    memcpy(salt + 16, out, 32);
    salt[15] ^= 1;
    _ddp_auth_job_key("correct horse", 13, salt, out);
    ok(memcmp(salt + 16, out, 32) != 0, "another salt -> another job key");
}

int main(void) {
    t_init();
    pbkdf2();
    sha256_vectors();
    hmac_vectors();
    incremental();
    equal_and_nonce();
    proofs();
    return t_done();
}
