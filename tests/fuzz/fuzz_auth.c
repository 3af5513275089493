/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/fuzz/fuzz_auth.c — libFuzzer harness for the store's handshake messages, both ends:
 * the client's parsers of the server's challenge and of its answer (_ddp_store_hs_hello,
 * _ddp_store_hs_welcome: what a fake master could send) and the server's HELLO handling on a
 * fresh, unauthenticated connection (what a stranger could send).
 *
 *   make fuzz FUZZ_SECONDS=60        (or: build/fuzz/fuzz_auth tests/fuzz/corpus_auth)
 *
 * Input: byte 0 bit 0 = both ends have a job secret; then 64 bytes of challenge, 24 bytes of
 * answer header and up to 32 bytes of answer value (missing bytes are zeros) for the client;
 * the whole input after byte 0 is also fed to the server as a stranger's first bytes. A
 * stranger must never end authenticated; the client must accept an answer only if it carries
 * the right proof, which the fuzzer cannot forge (checked: with a secret, an accepted answer
 * means the harness made it).
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char buf[sizeof(_ddp_store_chal_t) + sizeof(_ddp_store_resp_t) + _DDP_AUTH_PROOF_BYTES];
    unsigned char msg[_DDP_STORE_HELLO_BYTES], nc[_DDP_AUTH_NONCE_BYTES], ns[_DDP_AUTH_NONCE_BYTES];
    const char *secret;
    unsigned char key[32];
    size_t keylen;
    const size_t rest_at = sizeof(_ddp_store_chal_t) + sizeof(_ddp_store_resp_t);
    size_t msglen = 0, vlen;
    ddp_store_desc_t d;
    ddp_store_t *s;
    _ddp_store_conn_t *c;
    int hs;
    if (size < 1) return 0;
    secret = (data[0] & 1) ? "fuzz-secret" : "";
    memset(key, 0x5e, sizeof key);         /* a fixed key: the handshake is the target, not PBKDF2 */
    keylen = secret[0] ? sizeof key : 0;
    memset(buf, 0, sizeof buf);
    memcpy(buf, data + 1, size - 1 < sizeof buf ? size - 1 : sizeof buf);
    vlen = size - 1 > rest_at ? size - 1 - rest_at : 0;
    if (vlen > _DDP_AUTH_PROOF_BYTES) vlen = _DDP_AUTH_PROOF_BYTES;
    memset(nc, 0x44, sizeof nc);
    /* the client's side */
    hs = _ddp_store_hs_hello(key, keylen, buf, sizeof(_ddp_store_chal_t), nc, msg, &msglen, ns);
    if (hs == _DDP_HS_OK) {
        if (msglen > sizeof msg) __builtin_trap();
        hs = _ddp_store_hs_welcome(key, keylen, ns, nc, buf + sizeof(_ddp_store_chal_t), sizeof(_ddp_store_resp_t),
                                   buf + rest_at, vlen);
        if (hs == _DDP_HS_OK && secret[0]) {
            unsigned char want[_DDP_AUTH_PROOF_BYTES];
            _ddp_auth_proof(key, keylen, _DDP_AUTH_SERVER, _DDP_STORE_LABEL, ns, nc, want);
            if (vlen != sizeof want || memcmp(want, buf + rest_at, sizeof want)) __builtin_trap();
        }
    }
    /* the server's side: the same bytes from a stranger */
    memset(&d, 0, sizeof d);
    d.timeout_ms = 1000;
    d.secret = secret;
    d.log_level = 1;
    s = _ddp_store_new("127.0.0.1", 0, &d);
    if (!s) return 0;
    if (keylen) { memcpy(s->key, key, keylen); s->keylen = keylen; }
    c = _ddp_store_conn_new(s, -1, "fuzz");
    if (c) {
        int rc = _ddp_store_feed(s, c, data + 1, size - 1);
        if (secret[0] && c->state == _DDP_CONN_READY) __builtin_trap();   /* a random proof passed */
        if (c->state == _DDP_CONN_HELLO && c->in) __builtin_trap();       /* allocated before auth */
        if (rc != 0) _ddp_store_drop(s, c);
    }
    _ddp_store_reap(s);
    ddp_store_close(s);
    return 0;
}
