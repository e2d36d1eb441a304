/* tl-http-probe.h — a tiny blocking HTTP/1.1 GET for readiness checks. */
#ifndef LMSERVE_TL_HTTP_PROBE_H
#define LMSERVE_TL_HTTP_PROBE_H

/* GETs http://host:port/path with a total timeout; returns the status code
 * (e.g. 200, 503) or a negative cm_err when no answer came. */
int tl_http_probe(const char *host, int port, const char *path, int timeout_ms);

#endif
