/* test-tls-client.h — what the HTTPS tests share: a certificate authority,
 * a server certificate for 127.0.0.1 and localhost, a client certificate it
 * signed and one from a CA the server does not trust, all made at test time
 * with the `openssl` command; and a small blocking HTTPS/1.1 client on
 * OpenSSL (keep-alive, pipelining, Content-Length and chunked answers). */
#ifndef LMSERVE_TEST_TLS_CLIENT_H
#define LMSERVE_TEST_TLS_CLIENT_H
#include <openssl/ssl.h>
#include <stddef.h>

#include "tests/integration/test-http-client.h"

/* the files tt_make_pki writes into dir */
struct tt_pki {
  char ca[300];                     /* ca.pem: the CA the server and clients trust */
  char srv_cert[300], srv_key[300]; /* signed by ca, for 127.0.0.1 and localhost */
  char cli_cert[300], cli_key[300]; /* a client signed by ca */
  char bad_cert[300], bad_key[300]; /* a client signed by another CA */
  char other_ca[300];               /* that other CA, which did not sign the server's */
};

/* Makes the files in dir (skips the test, loudly, without the openssl command). */
void tt_make_pki(const char *dir, struct tt_pki *k);

/* one TLS client connection with its receive buffer */
struct tt_conn {
  int fd;
  SSL_CTX *ctx;
  SSL *ssl;
  char buf[1 << 16]; /* decrypted, not yet consumed */
  size_t len;
};

/* Connects to 127.0.0.1:port and completes the handshake, verifying the
 * server against ca; cert/key (or NULL) are the client's. Returns 0, or -1
 * (everything released). */
int tt_open(struct tt_conn *c, int port, const char *ca, const char *cert, const char *key);
void tt_close(struct tt_conn *c);
int tt_send(struct tt_conn *c, const char *s);
/* hc_parse_resp from c: 0, or -1 (closed, error, timeout). */
int tt_read_resp(struct tt_conn *c, struct resp *r, int timeout_ms);
/* 1 when the server closes the connection (TLS or TCP) within timeout_ms
 * without sending more data. */
int tt_closed_by_server(struct tt_conn *c, int timeout_ms);
double tt_now_s(void); /* monotonic seconds */
/* 1 when the server closes fd within timeout_ms; the bytes it sent
 * before go to *got (may be NULL). */
int tt_tcp_closed(int fd, int timeout_ms, size_t *got);

#endif
