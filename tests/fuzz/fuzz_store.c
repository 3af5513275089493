/* SPDX-License-Identifier: MIT (see LICENSE) */
/* tests/fuzz/fuzz_store.c — libFuzzer harness for the store server's request parser and
 * handlers (ddp_store.h), driven from a buffer: no sockets, no thread.
 *
 *   make fuzz FUZZ_SECONDS=60        (or: build/fuzz/fuzz_store tests/fuzz/corpus_store)
 *
 * Input: byte 0 = mode (bit 0: the store has a job secret; bit 1: authenticate first with a
 * valid HELLO, so the rest reaches every post-auth handler), byte 1 = chunk size - 1 (the
 * bytes arrive in pieces of that size, as from a socket), then the bytes a peer sends. After
 * each piece parked GET/WAITs are re-run as the server loop does, and answers are discarded.
 * Whatever the bytes, the server must neither crash, leak, nor read out of bounds; before
 * authentication it must allocate nothing sized by the peer (checked: at most the fixed
 * challenge buffer is held by the connection).
 */
#define _GNU_SOURCE
#define DDP_IMPLEMENTATION
#include "ddp_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void authenticate(ddp_store_t *s, _ddp_store_conn_t *c) {
    unsigned char msg[_DDP_STORE_HELLO_BYTES], nc[_DDP_AUTH_NONCE_BYTES], ns[_DDP_AUTH_NONCE_BYTES];
    size_t n = 0;
    memset(nc, 0x33, sizeof nc);
    /* the challenge the connection queued is the first thing in its output */
    if (_ddp_store_hs_hello(s->key, s->keylen, c->out, sizeof(_ddp_store_chal_t), nc, msg, &n, ns) != _DDP_HS_OK) __builtin_trap();
    if (_ddp_store_feed(s, c, msg, n) != 0 || c->state != _DDP_CONN_READY) __builtin_trap();
    c->out_len = c->out_off = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddp_store_desc_t d;
    ddp_store_t *s;
    _ddp_store_conn_t *c;
    size_t chunk, off;
    int mode;
    if (size < 2) return 0;
    mode = data[0];
    chunk = (size_t)data[1] + 1;
    data += 2;
    size -= 2;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 1000;
    d.secret = (mode & 1) ? "fuzz-secret" : "";
    d.log_level = 1;                       /* quiet */
    s = _ddp_store_new("127.0.0.1", 0, &d);
    if (!s) return 0;
    if (mode & 1) {                        /* a fixed key: the parser is the target, not PBKDF2 */
        memset(s->key, 0x5e, sizeof s->key);
        s->keylen = sizeof s->key;
    }
    c = _ddp_store_conn_new(s, -1, "fuzz");
    if (!c) { ddp_store_close(s); return 0; }
    if (mode & 2) authenticate(s, c);
    for (off = 0; off < size && c->state != _DDP_CONN_DEAD; off += chunk) {
        size_t n = size - off < chunk ? size - off : chunk;
        int pre = c->state == _DDP_CONN_HELLO;
        int rc = _ddp_store_feed(s, c, data + off, n);
        if (pre && c->state == _DDP_CONN_HELLO && (c->in || c->out_cap > 128)) __builtin_trap();
        if (rc != 0) { _ddp_store_drop(s, c); break; }
        if (s->changed) _ddp_store_rerun_waiting(s);
        if (c->state != _DDP_CONN_DEAD) c->out_len = c->out_off = 0;
    }
    _ddp_store_reap(s);
    ddp_store_close(s);
    return 0;
}
