/* fe-tls.h — TLS for the frontend's HTTP server, on OpenSSL memory BIOs.
 *
 * The server owns one fe_tls (key, certificate chain, optional client CA)
 * and gives each accepted connection an fe_tls_conn. Nothing here touches a
 * socket: the connection feeds the ciphertext it read with
 * fe_tls_conn_feed(), takes plaintext out with fe_tls_conn_read(), puts
 * plaintext in with fe_tls_conn_write(), and sends whatever ciphertext
 * fe_tls_conn_take() hands it (handshake records, alerts, encrypted data).
 * So the libuv loop never blocks on TLS. */
#ifndef LMSERVE_FE_TLS_H
#define LMSERVE_FE_TLS_H
#include <stddef.h>

#include "frontend/fe-http-buf.h"

struct fe_tls;
struct fe_tls_conn;

/* Loads the PEM private key and certificate chain (and, with ca_file, the
 * CAs that must have signed a client certificate; a connection without one
 * is refused). Returns 0, or CM_ERR_INVAL with the reason in `why` (a file
 * that cannot be read, a key that does not match the certificate). */
int fe_tls_create(const char *key_file, const char *cert_file, const char *ca_file,
                  struct fe_tls **out, char *why, size_t why_size);
void fe_tls_destroy(struct fe_tls *t);
int fe_tls_client_certs(const struct fe_tls *t); /* 1 when client certificates are required */

/* A connection's TLS state. Returns 0 or CM_ERR_NOMEM. */
int fe_tls_conn_create(struct fe_tls *t, struct fe_tls_conn **out);
void fe_tls_conn_destroy(struct fe_tls_conn *tc);

/* Hands over n bytes of ciphertext read from the socket. Returns 0 or
 * CM_ERR_NOMEM. */
int fe_tls_conn_feed(struct fe_tls_conn *tc, const char *p, size_t n);
/* Advances the handshake over what was fed. Returns 1 once it is complete,
 * 0 while it needs more input, CM_ERR_PARSE when it failed (logged, with
 * plain HTTP sent to the TLS port told apart); a failed connection may have
 * an alert to send (fe_tls_conn_take) and must then be closed. */
int fe_tls_conn_handshake(struct fe_tls_conn *tc);
/* Decrypts into dst (cap bytes). Returns bytes (> 0), 0 when no complete
 * record is buffered, CM_ERR_CLOSED when the client sent close_notify, or
 * CM_ERR_PARSE on a bad record. */
long fe_tls_conn_read(struct fe_tls_conn *tc, char *dst, size_t cap);
/* 1 when fed bytes or decrypted plaintext wait for fe_tls_conn_read. */
int fe_tls_conn_pending(const struct fe_tls_conn *tc);
/* Encrypts n bytes of plaintext (after the handshake). Returns 0 or
 * CM_ERR_PARSE. */
int fe_tls_conn_write(struct fe_tls_conn *tc, const char *p, size_t n);
/* Queues close_notify (only after a complete handshake). */
void fe_tls_conn_shutdown(struct fe_tls_conn *tc);
/* Appends the ciphertext waiting to be sent to `out`. Returns 0 or
 * CM_ERR_NOMEM. */
int fe_tls_conn_take(struct fe_tls_conn *tc, struct fe_buf *out);

#endif
