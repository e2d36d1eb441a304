/* test-http-limits.c — `lmserve frontend` under hostile clients: slowloris
 * heads and bodies, idle keep-alive, pipelining floods (backpressure), a
 * reader that never reads, the connection limit, and random damage to
 * request streams. Every case ends by checking the server still serves. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/cm-time.h"
#include "tests/harness/th-proc.h"
#include "tests/harness/th.h"
#include "tests/integration/test-http-client.h"

TH_TEST(http_slowloris_and_idle) {
  th_proc_init(60);
  struct server s;
  struct conn c;
  hc_server_open(&s, NULL, &c);
  /* a head dribbled slower than --header-timeout 0.6 s: 408 and close,
   * even though bytes keep arriving */
  double t0 = hc_now_s();
  const char *part = "GET /version HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n";
  struct resp r;
  int got = -1;
  for (size_t i = 0; i < strlen(part); i++) {
    if (hc_send_all(&c, part + i, 1) != 0) break;
    struct pollfd pf = {c.fd, POLLIN, 0};
    if (poll(&pf, 1, 100) > 0) break;
  }
  got = hc_read_resp(&c, &r, 6000);
  double dt = hc_now_s() - t0;
  TH_CHECK_EQ_INT(got, 0);
  TH_CHECK_EQ_INT(r.status, 408);
  TH_CHECK(dt >= 0.5 && dt < 6.0);
  TH_CHECK(hc_closed_by_server(&c, 6000));
  hc_conn_close(&c);
  /* a connection that sends nothing is closed after the header timeout */
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  t0 = hc_now_s();
  TH_CHECK(hc_closed_by_server(&c, 6000));
  dt = hc_now_s() - t0;
  TH_CHECK(dt >= 0.5 && dt < 6.0);
  hc_conn_close(&c);
  /* a body slower than --body-timeout: 408 */
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  TH_REQUIRE(
      hc_send_str(&c, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{") ==
      0);
  TH_REQUIRE(hc_read_resp(&c, &r, 6000) == 0);
  TH_CHECK_EQ_INT(r.status, 408);
  hc_conn_close(&c);
  /* keep-alive: an idle connection closes after --idle-timeout 0.8 s, and
   * not before */
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  TH_REQUIRE(hc_do_req(&c, GET("/version", ""), &r) == 0);
  TH_CHECK_EQ_INT(r.status, 200);
  t0 = hc_now_s();
  usleep(300000);
  TH_REQUIRE(hc_do_req(&c, GET("/version", ""), &r) == 0); /* still open at 0.3 s */
  t0 = hc_now_s();
  TH_CHECK(hc_closed_by_server(&c, 6000));
  dt = hc_now_s() - t0;
  TH_CHECK(dt >= 0.7 && dt < 6.0);
  hc_conn_close(&c);
  hc_check_alive(&s);
  hc_server_stop(&s);
}

/* Sends as much of all[0..n) as the server takes without blocking for
 * 300 ms; returns the bytes sent. */
/* Sends from all until the socket stays unwritable for wait_ms (the server
 * has stopped reading) or fails; returns the bytes sent. */
static size_t send_until_blocked(struct conn *c, const char *all, size_t n, int wait_ms) {
  size_t sent = 0;
  while (sent < n) {
    struct pollfd pf = {c->fd, POLLOUT, 0};
    if (poll(&pf, 1, wait_ms) <= 0) break;
    ssize_t k = send(c->fd, all + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  return sent;
}

/* Requests padded near --max-header-size, so that a few thousand of them
 * outgrow what the kernel's socket buffers absorb. */
#define PADDED_GET "GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Pad: " PAD "\r\n\r\n"
#define PAD16      "pppppppppppppppp"
#define PAD128     PAD16 PAD16 PAD16 PAD16 PAD16 PAD16 PAD16 PAD16
#define PAD        PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128 PAD128

static char *many_requests(size_t count, size_t *len) {
  const char *one = PADDED_GET;
  size_t n1 = strlen(one);
  char *all = malloc(n1 * count);
  if (!all) return NULL;
  for (size_t i = 0; i < count; i++)
    memcpy(all + i * n1, one, n1);
  *len = n1 * count;
  return all;
}

/* A client that pipelines many requests before reading: the server serves
 * others meanwhile and answers every request in order once the client
 * reads (its queue stays under the stall timeout: --body-timeout 5). */
TH_TEST(http_backpressure) {
  th_proc_init(60);
  struct server s;
  hc_server_start_with(&s, NULL, "5", NULL);
  struct conn c;
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  size_t n1 = strlen(PADDED_GET), total;
  char *all = many_requests(12000, &total);
  TH_REQUIRE(all);
  size_t sent = send_until_blocked(&c, all, total, 300);
  hc_check_alive(&s); /* others are served meanwhile */
  size_t want = sent / n1, seen = 0;
  struct resp r;
  while (seen < want && hc_read_resp(&c, &r, 5000) == 0 && r.status == 200)
    seen++;
  TH_CHECK_EQ_INT(seen, want);
  TH_CHECK(want > 1000);
  free(all);
  hc_conn_close(&c);
  hc_server_stop(&s);
}

/* A client that never reads its answers: once the server's queue for it
 * passes the high-water mark, the server stops reading it (bounded memory)
 * and drops it when the queue has made no progress for the write-stall
 * timeout (--body-timeout 0.6 s). The stall timer runs only over high
 * water, so the drop shows the bound was reached. */
TH_TEST(http_slow_reader_dropped) {
  th_proc_init(60);
  struct server s;
  struct conn c;
  hc_server_open(&s, NULL, &c);
  int rcv = 4096;
  setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
  size_t n1 = strlen(PADDED_GET), total;
  char *all = many_requests(12000, &total);
  TH_REQUIRE(all);
  /* blocked for a whole second: the server stopped reading, over high water
   * (a pause of a busy machine is shorter), and has dropped us or will */
  size_t sent = send_until_blocked(&c, all, total, 1000);
  usleep(2000000);
  size_t want = sent / n1, seen = 0;
  struct resp r;
  /* what the kernel still holds arrives, then the end; a server that kept
   * the client would answer everything (slowly, through the 4 KB window) */
  double end = cm_time_s() + 20.0;
  while (seen < want && cm_time_s() < end && hc_read_resp(&c, &r, 6000) == 0)
    seen++;
  TH_CHECK(seen < want);
  free(all);
  hc_conn_close(&c);
  hc_check_alive(&s);
  hc_server_stop(&s);
}

/* Random damage to valid request streams, sent in random pieces over many
 * connections, some reset abruptly mid-request: the server must stay up
 * and keep answering (under ASan this also checks its memory safety). */
TH_TEST(http_random_damage) {
  th_proc_init(getenv("LMSERVE_TEST_DAMAGE_ITERS") ? 0 : 90);
  struct server s;
  hc_server_start(&s, NULL);
  static const char *const seeds[] = {
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: "
      "27\r\n\r\n{\"prompt\":\"hi\",\"n\":2}     "
      "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n{\"messages\":[{\"\r\n1e\r\nrole\":\"user\",\"content\":\"x\"}]}\r\n0\r\n\r\n",
      "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /metrics HTTP/1.1\r\nHost: t\r\n"
      "Expect: 100-continue\r\n\r\n",
  };
  /* LMSERVE_TEST_DAMAGE_SEED / _ITERS run other or longer sequences */
  const char *seed_env = getenv("LMSERVE_TEST_DAMAGE_SEED");
  const char *iters_env = getenv("LMSERVE_TEST_DAMAGE_ITERS");
  uint64_t rng = seed_env ? strtoull(seed_env, NULL, 0) : 0x9e3779b97f4a7c15ull;
  int iters = iters_env ? atoi(iters_env) : 300;
  char buf[1024];
  for (int it = 0; it < iters; it++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const char *seed = seeds[(rng >> 33) % 3];
    size_t n = strlen(seed);
    memcpy(buf, seed, n);
    int edits = (int)((rng >> 40) % 4);
    for (int e = 0; e < edits; e++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(rng >> 20) % n;
      switch ((rng >> 50) % 4) {
      case 0: buf[at] ^= (char)(1u << ((rng >> 8) % 8)); break;    /* flip a bit */
      case 1: n = at + 1; break;                                   /* truncate */
      case 2: buf[at] = "\r\n: 0\x00\x7f"[(rng >> 12) % 7]; break; /* a framing byte */
      default:                                                     /* duplicate a span */
        if (n + 40 < sizeof(buf)) {
          memmove(buf + at + 40, buf + at, n - at);
          n += 40;
        }
      }
    }
    struct conn c;
    if (hc_conn_open(&c, s.port) != 0) {
      th_fail(__FILE__, __LINE__, "connect failed at iteration %d", it);
      hc_dump_server_stderr(&s);
      break;
    }
    /* in two pieces, cut at a random place */
    size_t cut = n ? (size_t)(rng >> 7) % n : 0;
    hc_send_all(&c, buf, cut);
    hc_send_all(&c, buf + cut, n - cut);
    if (rng & 1) { /* read whatever comes, briefly */
      struct resp r;
      while (hc_read_resp(&c, &r, 50) == 0) {
      }
    }
    if (rng & 2) { /* reset instead of closing */
      struct linger lg = {1, 0};
      setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    }
    hc_conn_close(&c);
  }
  hc_check_alive(&s);
  hc_server_stop(&s);
}

/* Chunked bodies whose size lines announce more than --max-body-size 4096
 * allows (one chunk too big, a chunk that passes the limit after others,
 * sizes that overflow 64 bits, digits with no line end yet, leading zeros,
 * a size line longer than its limit): each is a 413 as soon as the size
 * line says so. The body timeout is 30 s and no data follows the size
 * line, so an answer within a few seconds shows nothing was waited for. */
TH_TEST(http_chunk_size_over_limit) {
  th_proc_init(90);
  struct server s;
  hc_server_start_with(&s, NULL, "30", NULL);
  static const char head[] =
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  char zeros[4200];
  memset(zeros, '0', sizeof(zeros) - 8);
  memcpy(zeros + sizeof(zeros) - 8, "1001\r\n", 7);
  zeros[sizeof(zeros) - 1] = 0;
  char *longline = malloc(6000);
  TH_REQUIRE(longline);
  memset(longline, '0', 5999);
  longline[5999] = 0;
  const char *const cases[] = {
      "1001\r\n",                             /* 4097 bytes in one chunk */
      "10\r\n0123456789abcdef\r\nff1\r\n",    /* 16 + 4081 */
      "ffffffffffffffffffffffffffff\r\n",     /* overflows 64 bits */
      "7fffffffffffffff;x=y\r\n",             /* fits 64 bits, not the limit */
      "100000",                               /* no line end yet */
      zeros + sizeof(zeros) - 8 - 4000,       /* 4000 leading zeros, then 4097 */
      longline,                               /* a size line past its limit */
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct conn c;
    TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
    double t0 = hc_now_s();
    TH_REQUIRE(hc_send_str(&c, head) == 0);
    hc_send_all(&c, cases[i], strlen(cases[i]));
    struct resp r;
    int rc = hc_read_resp(&c, &r, 5000);
    double dt = hc_now_s() - t0;
    if (rc != 0 || r.status != 413)
      th_fail(__FILE__, __LINE__, "case %zu: rc %d status %d after %.2f s", i, rc,
              rc ? -1 : r.status, dt);
    else
      TH_CHECK(strstr(r.body, "\"error\"") != NULL);
    TH_CHECK(dt < 5.0);
    TH_CHECK(hc_closed_by_server(&c, 6000));
    hc_conn_close(&c);
  }
  free(longline);
  /* the limit itself is still accepted: 16 + 4080 bytes, then the end */
  struct conn c;
  TH_REQUIRE(hc_conn_open(&c, s.port) == 0);
  TH_REQUIRE(hc_send_str(&c, head) == 0);
  TH_REQUIRE(hc_send_str(&c, "10\r\n{\"prompt\":\"hi\"  \r\nff0\r\n") == 0);
  char *pad = malloc(4080 + 16);
  TH_REQUIRE(pad);
  memset(pad, ' ', 4079);
  memcpy(pad + 4079, "}\r\n0\r\n\r\n", 8);
  TH_REQUIRE(hc_send_all(&c, pad, 4079 + 8) == 0);
  free(pad);
  struct resp r;
  TH_REQUIRE(hc_read_resp(&c, &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 503); /* parsed and valid; no engine behind this frontend */
  hc_conn_close(&c);
  hc_check_alive(&s);
  hc_server_stop(&s);
}

/* Past --max-connections a new connection gets 503 and is closed; once one
 * closes, a new one is served again. */
TH_TEST(http_max_connections) {
  th_proc_init(60);
  struct server s;
  hc_server_start_with(&s, NULL, "0.6", "3");
  struct conn c[4];
  struct resp r;
  for (int i = 0; i < 3; i++) {
    TH_REQUIRE(hc_conn_open(&c[i], s.port) == 0);
    TH_REQUIRE(hc_do_req(&c[i], GET("/version", ""), &r) == 0);
    TH_CHECK_EQ_INT(r.status, 200);
  }
  TH_REQUIRE(hc_conn_open(&c[3], s.port) == 0);
  TH_REQUIRE(hc_read_resp(&c[3], &r, 5000) == 0);
  TH_CHECK_EQ_INT(r.status, 503);
  TH_CHECK(strstr(r.body, "too many connections") != NULL);
  TH_CHECK(hc_closed_by_server(&c[3], 6000));
  hc_conn_close(&c[3]);
  hc_conn_close(&c[0]);
  /* the server notices the closes soon: retry for a while */
  int status = 0;
  for (int tries = 0; tries < 50 && status != 200; tries++) {
    usleep(100000);
    TH_REQUIRE(hc_conn_open(&c[3], s.port) == 0);
    if (hc_do_req(&c[3], GET("/version", ""), &r) == 0) status = r.status;
    if (status != 200) hc_conn_close(&c[3]);
  }
  TH_CHECK_EQ_INT(status, 200);
  for (int i = 1; i < 4; i++)
    hc_conn_close(&c[i]);
  hc_server_stop(&s);
}
