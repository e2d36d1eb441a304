/* fe-audio.c — input_audio parts: base64, WAV (libsndfile) and MP3 (libmpg123)
 * decoding, downmix, libsoxr resampling. See fe-audio.h. */
#include "frontend/fe-audio.h"
#include "frontend/fe-b64.h"

#include <math.h>
#include <mpg123.h>
#include <sndfile.h>
#include <soxr.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"

struct lims {
  size_t max_bytes;
  double max_seconds;
};

static struct lims lims_of(const struct fe_audio_limits *l) {
  struct lims r = {FE_AUDIO_DEFAULT_MAX_BYTES, FE_AUDIO_DEFAULT_MAX_SECONDS};
  if (l && l->max_bytes) r.max_bytes = l->max_bytes;
  if (l && l->max_seconds > 0) r.max_seconds = l->max_seconds;
  return r;
}

void fe_audio_free(struct fe_audio *a) {
  if (!a) return;
  free(a->pcm);
  memset(a, 0, sizeof(*a));
}

/* ---- what the bytes look like ------------------------------------------------ */

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int is_wav(const uint8_t *d, size_t n) {
  return n >= 12 && (!memcmp(d, "RIFF", 4) || !memcmp(d, "RF64", 4)) && !memcmp(d + 8, "WAVE", 4);
}

/* An MPEG audio frame header at d (11 sync bits, a valid version, layer,
 * bitrate index and sample rate index). */
static int mpeg_header(const uint8_t *d, size_t n) {
  if (n < 4 || d[0] != 0xff || (d[1] & 0xe0) != 0xe0) return 0;
  int version = (d[1] >> 3) & 3, layer = (d[1] >> 1) & 3;
  int bitrate = d[2] >> 4, srate = (d[2] >> 2) & 3;
  return version != 1 && layer != 0 && bitrate != 15 && srate != 3;
}

static int is_mp3(const uint8_t *d, size_t n) {
  return (n >= 10 && !memcmp(d, "ID3", 3)) || mpeg_header(d, n);
}

/* A name for what data[0..n) holds, for the refusals of a wrong format. */
static const char *sniff(const uint8_t *d, size_t n) {
  if (is_wav(d, n)) return "WAV";
  if (is_mp3(d, n)) return "MP3";
  if (n >= 4 && !memcmp(d, "fLaC", 4)) return "FLAC";
  if (n >= 4 && !memcmp(d, "OggS", 4)) return "Ogg";
  if (n >= 12 && !memcmp(d + 4, "ftyp", 4)) return "MP4/M4A";
  if (n >= 8 && !memcmp(d, "\x89PNG", 4)) return "a PNG image";
  if (n >= 3 && !memcmp(d, "\xff\xd8\xff", 3)) return "a JPEG image";
  return NULL;
}

static int wrong_format(const uint8_t *d, size_t n, const char *format, char *err, size_t errlen) {
  const char *what = sniff(d, n);
  if (what)
    return cm_fail(err, errlen, CM_ERR_INVAL, "the data is %s, not %s (the part's format is '%s')",
                   what, !strcmp(format, "wav") ? "WAV" : "MP3", format);
  return cm_fail(err, errlen, CM_ERR_INVAL, "the data is not %s audio (the part's format is '%s')",
                 !strcmp(format, "wav") ? "WAV" : "MP3", format);
}

/* ---- WAV through libsndfile ---------------------------------------------------- */

struct memfile {
  const uint8_t *d;
  sf_count_t n, at;
};

static sf_count_t vio_len(void *u) {
  return ((struct memfile *)u)->n;
}

static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
  struct memfile *m = u;
  sf_count_t to = whence == SEEK_SET ? off : whence == SEEK_CUR ? m->at + off : m->n + off;
  if (to < 0 || to > m->n) return -1;
  return m->at = to;
}

static sf_count_t vio_read(void *ptr, sf_count_t count, void *u) {
  struct memfile *m = u;
  if (count > m->n - m->at) count = m->n - m->at;
  if (count <= 0) return 0;
  memcpy(ptr, m->d + m->at, (size_t)count);
  m->at += count;
  return count;
}

static sf_count_t vio_write(const void *ptr, sf_count_t count, void *u) {
  (void)ptr, (void)count, (void)u;
  return 0;
}

static sf_count_t vio_tell(void *u) {
  return ((struct memfile *)u)->at;
}

/* A RIFF/WAVE file whose data chunk declares more bytes than follow it. */
static int wav_truncated(const uint8_t *d, size_t n) {
  if (n < 12 || memcmp(d, "RIFF", 4) != 0) return 0; /* RF64 keeps its sizes elsewhere */
  size_t at = 12;
  while (at + 8 <= n) {
    uint32_t size = le32(d + at + 4);
    if (!memcmp(d + at, "data", 4))
      return size != 0 && size != 0xffffffffu && (uint64_t)size > n - at - 8;
    at += 8 + (size_t)size + (size & 1);
  }
  return at != n; /* a chunk header or body cut before any data chunk */
}

static int decode_wav(const uint8_t *data, size_t n, const struct lims *lim, float **pcm,
                      size_t *frames, int *rate, int *channels, char *err, size_t errlen) {
  if (!is_wav(data, n)) return wrong_format(data, n, "wav", err, errlen);
  if (wav_truncated(data, n))
    return cm_fail(err, errlen, CM_ERR_TRUNC,
                   "the WAV data is truncated (its data chunk declares more bytes than were sent)");
  struct memfile m = {data, (sf_count_t)n, 0};
  SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
  SF_INFO info;
  memset(&info, 0, sizeof(info));
  SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &m);
  if (!sf)
    return cm_fail(err, errlen, CM_ERR_PARSE, "the WAV data cannot be read: %s", sf_strerror(NULL));
  int rc = 0;
  int major = info.format & SF_FORMAT_TYPEMASK;
  if (major != SF_FORMAT_WAV && major != SF_FORMAT_WAVEX && major != SF_FORMAT_RF64) {
    rc = wrong_format(data, n, "wav", err, errlen);
  } else if (info.samplerate < FE_AUDIO_MIN_RATE || info.samplerate > FE_AUDIO_MAX_RATE) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "a sample rate of %d Hz is not supported (%d to %d Hz)", info.samplerate,
                 FE_AUDIO_MIN_RATE, FE_AUDIO_MAX_RATE);
  } else if (info.channels < 1 || info.channels > FE_AUDIO_MAX_CHANNELS) {
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED, "%d channels are not supported (1 to %d)",
                 info.channels, FE_AUDIO_MAX_CHANNELS);
  } else if (info.frames <= 0) {
    rc = cm_fail(err, errlen, CM_ERR_INVAL, "the WAV data holds no samples");
  } else if ((double)info.frames / info.samplerate > lim->max_seconds) {
    rc = cm_fail(err, errlen, CM_ERR_TOOBIG, "the audio is %.2f s long, over the limit of %g s",
                 (double)info.frames / info.samplerate, lim->max_seconds);
  }
  if (rc) {
    sf_close(sf);
    return rc;
  }
  size_t nf = (size_t)info.frames, ch = (size_t)info.channels;
  float *buf = malloc(nf * ch * sizeof(float));
  if (!buf) {
    sf_close(sf);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  sf_count_t got = sf_readf_float(sf, buf, info.frames);
  int sferr = sf_error(sf);
  sf_close(sf);
  if (got != info.frames || sferr) {
    free(buf);
    return cm_fail(err, errlen, got < info.frames ? CM_ERR_TRUNC : CM_ERR_PARSE,
                   "the WAV data is truncated or corrupt (%lld of %lld frames read)",
                   (long long)got, (long long)info.frames);
  }
  *pcm = buf, *frames = nf, *rate = info.samplerate, *channels = info.channels;
  return 0;
}

/* ---- MP3 through libmpg123 ------------------------------------------------------- */

static int mpg_fail(mpg123_handle *h, int code, const char *what, char *err, size_t errlen) {
  int rc = cm_fail(err, errlen, code, "%s: %s", what, h ? mpg123_strerror(h) : "no decoder");
  if (h) mpg123_delete(h);
  return rc;
}

/* The bytes of the MPEG frame whose header is at d (0 when unknown: free format). */
static size_t mpeg_frame_bytes(const uint8_t *d) {
  static const short br[2][3][15] = {
      {{0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448},
       {0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384},
       {0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}},
      {{0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256},
       {0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160},
       {0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}}};
  static const int sr[3] = {44100, 48000, 32000};
  int version = (d[1] >> 3) & 3; /* 3: MPEG 1, 2: MPEG 2, 0: MPEG 2.5 */
  int layer = 4 - ((d[1] >> 1) & 3);
  int lsf = version != 3;
  int kbps = br[lsf][layer - 1][d[2] >> 4];
  int rate = sr[(d[2] >> 2) & 3] >> (version == 3 ? 0 : version == 2 ? 1 : 2);
  int pad = (d[2] >> 1) & 1;
  if (!kbps) return 0;
  if (layer == 1) return (size_t)((12 * kbps * 1000 / rate + pad) * 4);
  int k = layer == 3 && lsf ? 72 : 144;
  return (size_t)(k * kbps * 1000 / rate + pad);
}

static int decode_mp3(const uint8_t *data, size_t n, const struct lims *lim, float **pcm,
                      size_t *frames, int *rate, int *channels, char *err, size_t errlen) {
  if (!is_mp3(data, n)) return wrong_format(data, n, "mp3", err, errlen);
  int e = MPG123_OK;
  mpg123_handle *h = mpg123_new(NULL, &e);
  if (!h) return cm_fail(err, errlen, CM_ERR_NOMEM, "the MP3 decoder cannot start");
  mpg123_param(h, MPG123_ADD_FLAGS, MPG123_QUIET | MPG123_FORCE_FLOAT, 0.0);
  mpg123_format_none(h);
  const long *rates;
  size_t n_rates;
  mpg123_rates(&rates, &n_rates);
  for (size_t i = 0; i < n_rates; i++)
    mpg123_format(h, rates[i], MPG123_MONO | MPG123_STEREO, MPG123_ENC_FLOAT_32);
  if (mpg123_open_feed(h) != MPG123_OK)
    return mpg_fail(h, CM_ERR_PARSE, "the MP3 decoder cannot start", err, errlen);
  if (mpg123_feed(h, data, n) != MPG123_OK)
    return mpg_fail(h, CM_ERR_PARSE, "the MP3 data cannot be read", err, errlen);
  float *buf = NULL;
  size_t len = 0, cap = 0; /* floats */
  long r = 0;
  int ch = 0, enc = 0;
  size_t max_frames = 0;
  for (;;) {
    unsigned char *audio;
    size_t bytes = 0;
    off_t num;
    e = mpg123_decode_frame(h, &num, &audio, &bytes);
    if (e == MPG123_NEW_FORMAT) {
      if (ch) { /* a stream that changes its format midway */
        free(buf);
        return mpg_fail(h, CM_ERR_UNSUPPORTED, "the MP3 stream changes its sample rate or channels",
                        err, errlen);
      }
      mpg123_getformat(h, &r, &ch, &enc);
      if (r < FE_AUDIO_MIN_RATE || r > FE_AUDIO_MAX_RATE || ch < 1 || ch > 2) {
        free(buf);
        return mpg_fail(h, CM_ERR_UNSUPPORTED, "the MP3 stream's format is not supported", err,
                        errlen);
      }
      max_frames = (size_t)floor(lim->max_seconds * (double)r);
      continue;
    }
    if (e == MPG123_NEED_MORE || e == MPG123_DONE) break;
    if (e != MPG123_OK) {
      free(buf);
      return mpg_fail(h, CM_ERR_PARSE, "the MP3 data is corrupt", err, errlen);
    }
    if (!ch || !bytes) continue;
    size_t add = bytes / sizeof(float);
    if (len + add > cap) {
      size_t nc = cap ? cap * 2 : 1 << 16;
      while (nc < len + add)
        nc *= 2;
      float *nb = realloc(buf, nc * sizeof(float));
      if (!nb) {
        free(buf);
        mpg123_delete(h);
        return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
      }
      buf = nb, cap = nc;
    }
    memcpy(buf + len, audio, add * sizeof(float));
    len += add;
    if (len / (size_t)ch > max_frames) {
      free(buf);
      mpg123_delete(h);
      return cm_fail(err, errlen, CM_ERR_TOOBIG, "the audio is longer than the limit of %g s",
                     lim->max_seconds);
    }
  }
  /* bytes the parser holds without having decoded them: a frame cut short */
  long fill = 0;
  double unused;
  mpg123_getstate(h, MPG123_BUFFERFILL, &fill, &unused);
  mpg123_delete(h);
  if (!ch || len == 0) {
    free(buf);
    return cm_fail(err, errlen, CM_ERR_INVAL, "no MPEG audio frames were found in the MP3 data");
  }
  if (fill >= 4 && (size_t)fill <= n && mpeg_header(data + n - (size_t)fill, (size_t)fill)) {
    size_t need = mpeg_frame_bytes(data + n - (size_t)fill);
    if (need == 0 || (size_t)fill < need) {
      free(buf);
      return cm_fail(err, errlen, CM_ERR_TRUNC,
                     "the MP3 data is truncated (its last frame needs %zu bytes, %ld were sent)",
                     need, fill);
    }
  }
  *pcm = buf, *frames = len / (size_t)ch, *rate = (int)r, *channels = ch;
  return 0;
}

/* ---- downmix, resample -------------------------------------------------------------- */

int fe_audio_decode(const uint8_t *data, size_t n, const char *format,
                    const struct fe_audio_limits *limits, int rate, struct fe_audio *out, char *err,
                    size_t errlen) {
  memset(out, 0, sizeof(*out));
  struct lims lim = lims_of(limits);
  int wav = format && !strcmp(format, "wav"), mp3 = format && !strcmp(format, "mp3");
  if (!wav && !mp3)
    return cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                   "format '%.20s' is not supported ('wav' or 'mp3')", format ? format : "");
  if (n == 0) return cm_fail(err, errlen, CM_ERR_INVAL, "empty audio data");
  if (n > lim.max_bytes)
    return cm_fail(err, errlen, CM_ERR_TOOBIG, "the audio data is %zu bytes, over the limit of %zu",
                   n, lim.max_bytes);
  if (rate < FE_AUDIO_MIN_RATE || rate > FE_AUDIO_MAX_RATE)
    return cm_fail(err, errlen, CM_ERR_INVAL, "target rate %d Hz out of range", rate);
  float *pcm = NULL;
  size_t frames = 0;
  int src_rate = 0, ch = 0;
  int rc = wav ? decode_wav(data, n, &lim, &pcm, &frames, &src_rate, &ch, err, errlen)
               : decode_mp3(data, n, &lim, &pcm, &frames, &src_rate, &ch, err, errlen);
  if (rc) return rc;
  /* mono: the mean of the channels, in place (librosa.to_mono) */
  if (ch > 1) {
    for (size_t i = 0; i < frames; i++) {
      double s = 0;
      for (int c = 0; c < ch; c++)
        s += pcm[i * (size_t)ch + (size_t)c];
      pcm[i] = (float)(s / ch);
    }
  }
  out->src_rate = src_rate, out->src_channels = ch, out->rate = rate;
  out->seconds = (double)frames / src_rate;
  if (src_rate == rate) {
    float *p = realloc(pcm, (frames ? frames : 1) * sizeof(float));
    out->pcm = p ? p : pcm, out->n = frames;
    return 0;
  }
  size_t olen = (size_t)ceil((double)frames * rate / src_rate) + 1, done = 0;
  float *res = malloc(olen * sizeof(float));
  if (!res) {
    free(pcm);
    return cm_fail(err, errlen, CM_ERR_NOMEM, "out of memory");
  }
  soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
  soxr_error_t se =
      soxr_oneshot(src_rate, rate, 1, pcm, frames, NULL, res, olen, &done, &io, &q, NULL);
  free(pcm);
  if (se) {
    free(res);
    return cm_fail(err, errlen, CM_ERR_PARSE, "resampling failed: %s", se);
  }
  if (done == 0) { /* a clip shorter than one sample at the model's rate */
    free(res);
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "the audio is too short: %zu samples at %d Hz give none at %d Hz", frames,
                   src_rate, rate);
  }
  out->pcm = res, out->n = done;
  return 0;
}

int fe_audio_decode_b64(const char *b64, size_t len, const char *format,
                        const struct fe_audio_limits *limits, int rate, struct fe_audio *out,
                        char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  struct lims lim = lims_of(limits);
  const unsigned char *p = (const unsigned char *)b64;
  if (len >= 5 && !strncmp(b64, "data:", 5)) { /* a data: URL sent as the data */
    const char *comma = memchr(b64, ',', len);
    if (!comma || comma - b64 < 7 || strncmp(comma - 7, ";base64", 7) != 0)
      return cm_fail(err, errlen, CM_ERR_INVAL, "a data: URL as audio data must be ';base64,'");
    p = (const unsigned char *)comma + 1;
    len -= (size_t)(comma + 1 - b64);
  }
  uint8_t *buf;
  size_t k;
  int rc = fe_b64_decode(p, len, lim.max_bytes, "audio data", &buf, &k, err, errlen);
  if (rc) return rc;
  rc = fe_audio_decode(buf, k, format, limits, rate, out, err, errlen);
  free(buf);
  return rc;
}
