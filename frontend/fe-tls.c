/* fe-tls.c — the frontend's TLS (see fe-tls.h): an OpenSSL server context
 * from PEM files, and per connection an SSL object between two memory BIOs,
 * one holding the ciphertext read from the socket, the other the ciphertext
 * to send. */
#include "frontend/fe-tls.h"

#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/cm-err.h"
#include "common/cm-log.h"

#define TAG "tls"

struct fe_tls {
  SSL_CTX *ctx;
  int client_certs; /* --ssl-ca-certs given: a client certificate is required */
};

struct fe_tls_conn {
  SSL *ssl;
  BIO *rbio; /* ciphertext read from the socket, owned by ssl */
  BIO *wbio; /* ciphertext to send, owned by ssl */
  int done;  /* handshake complete */
  int failed;
};

/* The reason of OpenSSL's oldest queued error, for a log line or `why`;
 * clears the queue. */
static const char *ssl_reason(char *buf, size_t size) {
  unsigned long e = ERR_get_error();
  if (!e) {
    snprintf(buf, size, "unknown error");
  } else {
    const char *r = ERR_reason_error_string(e);
    snprintf(buf, size, "%s", r ? r : "unknown error");
  }
  ERR_clear_error();
  return buf;
}

int fe_tls_create(const char *key_file, const char *cert_file, const char *ca_file,
                  struct fe_tls **out, char *why, size_t why_size) {
  char reason[160];
  struct fe_tls *t = calloc(1, sizeof(*t));
  if (!t) return CM_ERR_NOMEM;
  ERR_clear_error();
  t->ctx = SSL_CTX_new(TLS_server_method());
  if (!t->ctx) {
    snprintf(why, why_size, "cannot create a TLS context: %s", ssl_reason(reason, sizeof(reason)));
    goto fail;
  }
  SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
  /* no renegotiation: a client could make the server redo handshakes at will */
  SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_use_certificate_chain_file(t->ctx, cert_file) != 1) {
    snprintf(why, why_size, "--ssl-certfile %s: %s", cert_file, ssl_reason(reason, sizeof(reason)));
    goto fail;
  }
  if (SSL_CTX_use_PrivateKey_file(t->ctx, key_file, SSL_FILETYPE_PEM) != 1 &&
      ERR_GET_REASON(ERR_peek_last_error()) != X509_R_KEY_VALUES_MISMATCH) {
    snprintf(why, why_size, "--ssl-keyfile %s: %s", key_file, ssl_reason(reason, sizeof(reason)));
    goto fail;
  }
  if (SSL_CTX_check_private_key(t->ctx) != 1) { /* also a key OpenSSL refused as a mismatch */
    snprintf(why, why_size, "--ssl-keyfile %s does not match --ssl-certfile %s: %s", key_file,
             cert_file, ssl_reason(reason, sizeof(reason)));
    goto fail;
  }
  if (ca_file) {
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca_file);
    if (!names || SSL_CTX_load_verify_locations(t->ctx, ca_file, NULL) != 1) {
      snprintf(why, why_size, "--ssl-ca-certs %s: %s", ca_file,
               names ? ssl_reason(reason, sizeof(reason)) : "no CA certificate in the file");
      if (names) sk_X509_NAME_pop_free(names, X509_NAME_free);
      goto fail;
    }
    SSL_CTX_set_client_CA_list(t->ctx, names); /* takes `names` */
    SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    t->client_certs = 1;
  }
  *out = t;
  return 0;
fail:
  ERR_clear_error();
  fe_tls_destroy(t);
  return CM_ERR_INVAL;
}

void fe_tls_destroy(struct fe_tls *t) {
  if (!t) return;
  SSL_CTX_free(t->ctx); /* connections still open hold their own reference */
  free(t);
}

int fe_tls_client_certs(const struct fe_tls *t) {
  return t->client_certs;
}

int fe_tls_conn_create(struct fe_tls *t, struct fe_tls_conn **out) {
  struct fe_tls_conn *tc = calloc(1, sizeof(*tc));
  if (!tc) return CM_ERR_NOMEM;
  tc->ssl = SSL_new(t->ctx);
  tc->rbio = BIO_new(BIO_s_mem());
  tc->wbio = BIO_new(BIO_s_mem());
  if (!tc->ssl || !tc->rbio || !tc->wbio) {
    BIO_free(tc->rbio);
    BIO_free(tc->wbio);
    SSL_free(tc->ssl);
    free(tc);
    ERR_clear_error();
    return CM_ERR_NOMEM;
  }
  /* an empty memory BIO reads as "try again", not as end of stream */
  BIO_set_mem_eof_return(tc->rbio, -1);
  SSL_set_bio(tc->ssl, tc->rbio, tc->wbio);
  SSL_set_accept_state(tc->ssl);
  *out = tc;
  return 0;
}

void fe_tls_conn_destroy(struct fe_tls_conn *tc) {
  if (!tc) return;
  SSL_free(tc->ssl); /* frees both BIOs */
  free(tc);
}

int fe_tls_conn_pending(const struct fe_tls_conn *tc) {
  return SSL_has_pending(tc->ssl) || BIO_ctrl_pending(tc->rbio) > 0;
}

int fe_tls_conn_feed(struct fe_tls_conn *tc, const char *p, size_t n) {
  while (n) {
    int k = BIO_write(tc->rbio, p, n > INT_MAX ? INT_MAX : (int)n);
    if (k <= 0) return CM_ERR_NOMEM;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Logs why a handshake failed, naming the usual causes in words. */
static void log_handshake_failure(struct fe_tls_conn *tc, int ssl_err) {
  char reason[160];
  unsigned long e = ERR_peek_error();
  int lib = ERR_GET_LIB(e), r = ERR_GET_REASON(e);
  if (ssl_err == SSL_ERROR_SSL && lib == ERR_LIB_SSL && r == SSL_R_HTTP_REQUEST) {
    cm_warn(TAG, "closing a connection that sent plain HTTP to the TLS port (use https://)");
    ERR_clear_error();
  } else if (ssl_err == SSL_ERROR_SSL && lib == ERR_LIB_SSL &&
             r == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
    cm_warn(TAG, "TLS handshake refused: the client sent no certificate (--ssl-ca-certs)");
    ERR_clear_error();
  } else if (SSL_get_verify_result(tc->ssl) != X509_V_OK) {
    cm_warn(TAG, "TLS handshake refused: client certificate: %s",
            X509_verify_cert_error_string(SSL_get_verify_result(tc->ssl)));
    ERR_clear_error();
  } else {
    cm_warn(TAG, "TLS handshake failed: %s", ssl_reason(reason, sizeof(reason)));
  }
}

int fe_tls_conn_handshake(struct fe_tls_conn *tc) {
  if (tc->done) return 1;
  if (tc->failed) return CM_ERR_PARSE;
  ERR_clear_error();
  int rc = SSL_do_handshake(tc->ssl);
  if (rc == 1) {
    tc->done = 1;
    return 1;
  }
  int err = SSL_get_error(tc->ssl, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return 0;
  tc->failed = 1;
  log_handshake_failure(tc, err);
  return CM_ERR_PARSE;
}

long fe_tls_conn_read(struct fe_tls_conn *tc, char *dst, size_t cap) {
  if (tc->failed) return CM_ERR_PARSE;
  if (!fe_tls_conn_pending(tc)) return 0; /* spares SSL_read's failing call per request */
  ERR_clear_error();
  int n = SSL_read(tc->ssl, dst, cap > INT_MAX ? INT_MAX : (int)cap);
  if (n > 0) return n;
  int err = SSL_get_error(tc->ssl, n);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return 0;
  if (err == SSL_ERROR_ZERO_RETURN) return CM_ERR_CLOSED;
  char reason[160];
  tc->failed = 1;
  cm_warn(TAG, "closing a connection after a bad TLS record: %s",
          ssl_reason(reason, sizeof(reason)));
  return CM_ERR_PARSE;
}

int fe_tls_conn_write(struct fe_tls_conn *tc, const char *p, size_t n) {
  if (tc->failed || !tc->done) return CM_ERR_PARSE;
  while (n) {
    ERR_clear_error();
    /* into a memory BIO, which grows: every write completes whole */
    int k = SSL_write(tc->ssl, p, n > INT_MAX ? INT_MAX : (int)n);
    if (k <= 0) {
      char reason[160];
      tc->failed = 1;
      cm_warn(TAG, "cannot encrypt an answer: %s", ssl_reason(reason, sizeof(reason)));
      return CM_ERR_PARSE;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

void fe_tls_conn_shutdown(struct fe_tls_conn *tc) {
  if (!tc->done || tc->failed) return;
  ERR_clear_error();
  SSL_shutdown(tc->ssl); /* queues close_notify; the client's answer is not awaited */
  ERR_clear_error();
}

int fe_tls_conn_take(struct fe_tls_conn *tc, struct fe_buf *out) {
  size_t n = BIO_ctrl_pending(tc->wbio);
  if (!n) return 0;
  if (fe_buf_reserve(out, n) != 0) return CM_ERR_NOMEM;
  int k = BIO_read(tc->wbio, out->data + out->len, (int)n);
  if (k > 0) out->len += (size_t)k;
  out->data[out->len] = 0;
  return 0;
}
