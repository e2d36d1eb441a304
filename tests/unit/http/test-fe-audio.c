/* test-fe-audio.c — the input_audio decoders of fe-audio.c. Every file is made
 * here at run time with libsndfile's own writers (WAV in several sample
 * formats; MP3 through its LAME encoder), so no binary fixture is committed.
 * WAV at 16 kHz mono must decode to exactly its samples; other rates and
 * stereo must give the downmixed sine, resampled to 16 kHz, within 1e-3 away
 * from the edges; MP3 (lossy) within a small RMS error of the sine. Then the
 * bad-input matrix: truncated WAV and MP3, each format sent as the other, data
 * that is no audio, audio over 30 s, bad base64, an unknown format, an empty
 * part — each an error with its cm_err code and a reason, never a crash.
 * Every prefix of a small WAV and MP3 is decoded too (errors or shorter audio,
 * never a crash), from exact-size heap copies so that ASan sees any over-read. */
#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-audio.h"
#include "tests/harness/th.h"

/* ---- files made in memory ---------------------------------------------------------- */

struct mfile {
  uint8_t *p;
  sf_count_t n, cap, at;
};

static sf_count_t m_len(void *u) {
  return ((struct mfile *)u)->n;
}
static sf_count_t m_seek(sf_count_t off, int whence, void *u) {
  struct mfile *m = u;
  m->at = whence == SEEK_SET ? off : whence == SEEK_CUR ? m->at + off : m->n + off;
  return m->at;
}
static sf_count_t m_read(void *ptr, sf_count_t count, void *u) {
  struct mfile *m = u;
  if (count > m->n - m->at) count = m->n - m->at;
  if (count <= 0) return 0;
  memcpy(ptr, m->p + m->at, (size_t)count);
  m->at += count;
  return count;
}
static sf_count_t m_write(const void *ptr, sf_count_t count, void *u) {
  struct mfile *m = u;
  if (m->at + count > m->cap) {
    m->cap = (m->at + count) * 2;
    m->p = realloc(m->p, (size_t)m->cap);
  }
  memcpy(m->p + m->at, ptr, (size_t)count);
  m->at += count;
  if (m->at > m->n) m->n = m->at;
  return count;
}
static sf_count_t m_tell(void *u) {
  return ((struct mfile *)u)->at;
}

/* frames x channels of a sine (channel c at amplitude amp * (1 - 0.25 c)) in
 * `format`; *n bytes, malloc'd. */
static uint8_t *make_file(int format, int rate, int channels, size_t frames, double hz, double amp,
                          size_t *n) {
  struct mfile m = {0};
  SF_VIRTUAL_IO vio = {m_len, m_seek, m_read, m_write, m_tell};
  SF_INFO info = {.samplerate = rate, .channels = channels, .format = format};
  SNDFILE *sf = sf_open_virtual(&vio, SFM_WRITE, &info, &m);
  if (!sf) {
    fprintf(stderr, "sf_open_virtual: %s\n", sf_strerror(NULL));
    return NULL;
  }
  float *buf = malloc(frames * (size_t)channels * sizeof(float));
  for (size_t i = 0; i < frames; i++)
    for (int c = 0; c < channels; c++)
      buf[i * (size_t)channels + (size_t)c] =
          (float)(amp * (1 - 0.25 * c) * sin(2 * M_PI * hz * (double)i / rate));
  sf_writef_float(sf, buf, (sf_count_t)frames);
  sf_close(sf);
  free(buf);
  *n = (size_t)m.n;
  return m.p;
}

static char *b64(const uint8_t *d, size_t n) {
  static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *s = malloc((n + 2) / 3 * 4 + 1), *o = s;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) |
                 (i + 2 < n ? d[i + 2] : 0);
    *o++ = al[v >> 18 & 63], *o++ = al[v >> 12 & 63];
    *o++ = i + 1 < n ? al[v >> 6 & 63] : '=';
    *o++ = i + 2 < n ? al[v & 63] : '=';
  }
  *o = 0;
  return s;
}

static int decode(const uint8_t *d, size_t n, const char *fmt, struct fe_audio *a, char *err) {
  uint8_t *copy = malloc(n ? n : 1); /* exact size, for ASan */
  memcpy(copy, d, n);
  int rc = fe_audio_decode(copy, n, fmt, NULL, 16000, a, err, 256);
  free(copy);
  return rc;
}

/* ---- good audio --------------------------------------------------------------------- */

TH_TEST(wav_16k_mono_exact) {
  size_t n;
  uint8_t *f = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 8000, 440, 0.5, &n);
  TH_REQUIRE(f);
  char *s = b64(f, n), err[256] = "";
  struct fe_audio a;
  TH_REQUIRE(fe_audio_decode_b64(s, strlen(s), "wav", NULL, 16000, &a, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT((int)a.n, 8000);
  TH_CHECK_EQ_INT(a.src_rate, 16000);
  TH_CHECK_EQ_INT(a.src_channels, 1);
  TH_CHECK_NEAR(a.seconds, 0.5, 1e-12);
  double worst = 0;
  for (size_t i = 0; i < a.n; i++) {
    /* libsndfile writes round(x * 32767) and reads v / 32768 */
    double x = 0.5 * sin(2 * M_PI * 440 * (double)i / 16000);
    double want = (double)(short)lrint(x * 32767) / 32768.0;
    worst = fmax(worst, fabs(a.pcm[i] - want));
  }
  TH_CHECK(worst < 1e-7);
  fe_audio_free(&a);
  /* a data: URL is taken as the data too */
  size_t ul = strlen(s) + 32;
  char *url = malloc(ul);
  snprintf(url, ul, "data:audio/wav;base64,%s", s);
  TH_CHECK(fe_audio_decode_b64(url, strlen(url), "wav", NULL, 16000, &a, err, sizeof(err)) == 0);
  TH_CHECK_EQ_INT((int)a.n, 8000);
  fe_audio_free(&a);
  free(url);
  free(s);
  free(f);
}

/* sine at `rate` with `channels` (the mean of the channels is 1 - 0.125 (ch-1)
 * of amp), resampled to 16 kHz: compare with the sine away from the edges. */
static void resampled_sine(int format, int rate, int channels, double tol) {
  size_t frames = (size_t)rate, n; /* 1 s */
  uint8_t *f = make_file(format, rate, channels, frames, 1000, 0.5, &n);
  TH_REQUIRE(f);
  struct fe_audio a;
  char err[256] = "";
  int rc = decode(f, n, "wav", &a, err);
  if (rc) th_fail(__FILE__, __LINE__, "rate %d: %s", rate, err);
  TH_REQUIRE(rc == 0);
  TH_CHECK(a.n >= 15999 && a.n <= 16001);
  double mean_amp = 0;
  for (int c = 0; c < channels; c++)
    mean_amp += 0.5 * (1 - 0.25 * c) / channels;
  double worst = 0;
  for (size_t i = 800; i + 800 < a.n; i++)
    worst = fmax(worst, fabs(a.pcm[i] - mean_amp * sin(2 * M_PI * 1000 * (double)i / 16000)));
  if (worst > tol) th_fail(__FILE__, __LINE__, "rate %d, %d ch: off by %g", rate, channels, worst);
  fe_audio_free(&a);
  free(f);
}

TH_TEST(wav_resampled_and_downmixed) {
  resampled_sine(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 44100, 1, 1e-3);
  resampled_sine(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 48000, 2, 1e-3);
  resampled_sine(SF_FORMAT_WAV | SF_FORMAT_PCM_24, 8000, 1, 1e-3);
  resampled_sine(SF_FORMAT_WAVEX | SF_FORMAT_PCM_16, 22050, 3, 1e-3);
}

TH_TEST(mp3_decodes) {
  size_t n;
  uint8_t *f = make_file(SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 44100, 2, 44100, 440, 0.5, &n);
  if (!f) TH_SKIP("this libsndfile writes no MP3");
  struct fe_audio a;
  char err[256] = "";
  int rc = decode(f, n, "mp3", &a, err);
  if (rc) th_fail(__FILE__, __LINE__, "%s", err);
  TH_REQUIRE(rc == 0);
  TH_CHECK_EQ_INT(a.src_rate, 44100);
  TH_CHECK_EQ_INT(a.src_channels, 2);
  /* the encoder's delay and padding lengthen the stream a little */
  TH_CHECK(a.n >= 16000 && a.n < 16000 + 2400);
  double rms = 0;
  for (size_t i = 4000; i < 12000; i++)
    rms += (double)a.pcm[i] * a.pcm[i];
  rms = sqrt(rms / 8000);
  TH_CHECK_NEAR(rms, 0.4375 / sqrt(2.0), 0.02); /* mean amplitude of the two channels */
  fe_audio_free(&a);
  free(f);
}

/* ---- bad audio ---------------------------------------------------------------------- */

static void expect(int rc, int want, const char *err, const char *needle, int line) {
  if (rc != want || !strstr(err, needle))
    th_fail(__FILE__, line, "rc %d (want %d), \"%s\" (want \"%s\" in it)", rc, want, err, needle);
}

TH_TEST(bad_inputs) {
  size_t nw, nm;
  uint8_t *w = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 16000, 440, 0.5, &nw);
  uint8_t *m = make_file(SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 16000, 1, 16000, 440, 0.5, &nm);
  TH_REQUIRE(w && m);
  struct fe_audio a;
  char err[256];
  err[0] = 0;
  expect(decode(w, nw - 1000, "wav", &a, err), CM_ERR_TRUNC, err, "truncated", __LINE__);
  err[0] = 0;
  expect(decode(m, nm * 2 / 3, "mp3", &a, err), CM_ERR_TRUNC, err, "truncated", __LINE__);
  err[0] = 0;
  expect(decode(w, nw, "mp3", &a, err), CM_ERR_INVAL, err, "is WAV, not MP3", __LINE__);
  err[0] = 0;
  expect(decode(m, nm, "wav", &a, err), CM_ERR_INVAL, err, "is MP3, not WAV", __LINE__);
  const char *text = "this is not audio at all, just some text sent as audio";
  err[0] = 0;
  expect(decode((const uint8_t *)text, strlen(text), "wav", &a, err), CM_ERR_INVAL, err,
         "not WAV audio", __LINE__);
  err[0] = 0;
  expect(decode((const uint8_t *)text, strlen(text), "mp3", &a, err), CM_ERR_INVAL, err,
         "not MP3 audio", __LINE__);
  err[0] = 0;
  expect(decode(w, nw, "flac", &a, err), CM_ERR_UNSUPPORTED, err, "'flac' is not supported",
         __LINE__);
  err[0] = 0;
  expect(decode(w, 0, "wav", &a, err), CM_ERR_INVAL, err, "empty", __LINE__);
  err[0] = 0;
  expect(fe_audio_decode_b64("UklG*kZ", 7, "wav", NULL, 16000, &a, err, sizeof(err)), CM_ERR_INVAL,
         err, "base64", __LINE__);
  err[0] = 0;
  expect(fe_audio_decode_b64("UklGR", 5, "wav", NULL, 16000, &a, err, sizeof(err)), CM_ERR_INVAL,
         err, "base64", __LINE__);
  /* a RIFF header that says WAVE but whose chunks are garbage */
  uint8_t junk[64] = "RIFF\x38\0\0\0WAVEfmt \x02\0\0\0\x01\0data\xff\0\0\0";
  err[0] = 0;
  int rc = decode(junk, sizeof(junk), "wav", &a, err);
  if (rc == 0 || !err[0]) th_fail(__FILE__, __LINE__, "junk WAV: rc %d \"%s\"", rc, err);
  free(w), free(m);
  /* one sample at 48 kHz is none at 16 kHz: refused, not an empty clip */
  w = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 48000, 1, 1, 440, 0.5, &nw);
  TH_REQUIRE(w);
  err[0] = 0;
  expect(decode(w, nw, "wav", &a, err), CM_ERR_INVAL, err, "too short: 1 samples at 48000 Hz",
         __LINE__);
  free(w);
  /* too long: 31 s (WAV: refused from the header; MP3: while decoding) */
  w = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 8000, 1, 8000 * 31, 440, 0.5, &nw);
  m = make_file(SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 8000, 1, 8000 * 31, 440, 0.5, &nm);
  TH_REQUIRE(w && m);
  err[0] = 0;
  expect(decode(w, nw, "wav", &a, err), CM_ERR_TOOBIG, err, "over the limit of 30 s", __LINE__);
  err[0] = 0;
  expect(decode(m, nm, "mp3", &a, err), CM_ERR_TOOBIG, err, "limit of 30 s", __LINE__);
  /* a lower limit, and the bytes limit */
  struct fe_audio_limits lim = {.max_seconds = 10};
  err[0] = 0;
  expect(fe_audio_decode(w, nw, "wav", &lim, 16000, &a, err, sizeof(err)), CM_ERR_TOOBIG, err,
         "limit of 10 s", __LINE__);
  lim = (struct fe_audio_limits){.max_bytes = 1000};
  err[0] = 0;
  expect(fe_audio_decode(w, nw, "wav", &lim, 16000, &a, err, sizeof(err)), CM_ERR_TOOBIG, err,
         "bytes", __LINE__);
  free(w), free(m);
}

/* every prefix of a short WAV and MP3: an error or (rarely, for MP3 cut at a
 * frame boundary) shorter audio; never a crash or a read past the end */
TH_TEST(every_prefix) {
  size_t nw, nm;
  uint8_t *w = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 2, 400, 440, 0.5, &nw);
  uint8_t *m = make_file(SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 16000, 1, 1600, 440, 0.5, &nm);
  TH_REQUIRE(w && m);
  size_t ok_w = 0;
  for (size_t k = 0; k < nw; k++) {
    struct fe_audio a;
    char err[256] = "";
    int rc = decode(w, k, "wav", &a, err);
    if (rc == 0)
      ok_w++, fe_audio_free(&a);
    else if (!err[0])
      th_fail(__FILE__, __LINE__, "WAV prefix %zu: rc %d without a reason", k, rc);
  }
  TH_CHECK_EQ_INT((int)ok_w, 0); /* every cut WAV is refused */
  for (size_t k = 0; k < nm; k++) {
    struct fe_audio a;
    char err[256] = "";
    int rc = decode(m, k, "mp3", &a, err);
    if (rc == 0)
      fe_audio_free(&a);
    else if (!err[0])
      th_fail(__FILE__, __LINE__, "MP3 prefix %zu: rc %d without a reason", k, rc);
  }
  free(w), free(m);
}
