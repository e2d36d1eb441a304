/* tl-http-probe.h — a tiny blocking HTTP/1.1 (or HTTPS) GET for readiness checks. */
#ifndef LMSERVE_TL_HTTP_PROBE_H
#define LMSERVE_TL_HTTP_PROBE_H

/* GETs http://host:port/path with a total timeout; returns the status code
 * (e.g. 200, 503) or a negative cm_err when no answer came. */
int tl_http_probe(const char *host, int port, const char *path, int timeout_ms);

/* The same over HTTPS. The server's certificate is not verified (the probe
 * reaches serve's own frontend); when the server wants a client certificate,
 * cert_file and key_file (PEM, may be NULL) are presented. */
int tl_https_probe(const char *host, int port, const char *path, int timeout_ms,
                   const char *cert_file, const char *key_file);

#endif
