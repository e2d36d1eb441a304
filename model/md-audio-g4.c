/* md-audio-g4.c — Gemma 4's log-mel features and audio soft-token count. See
 * md-audio-g4.h. */
#include "model/md-audio-g4.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm-err.h"
#include "model/md-config.h"

static void derive(struct md_audio_fe_cfg *c) {
  c->frame_length = (int)lround(c->sampling_rate * c->frame_length_ms / 1000.0);
  c->hop_length = (int)lround(c->sampling_rate * c->hop_length_ms / 1000.0);
  int f = 1;
  while (f < c->frame_length)
    f *= 2;
  c->fft_length = c->fft_overdrive ? 2 * f : f;
}

void md_audio_fe_defaults(struct md_audio_fe_cfg *c) {
  memset(c, 0, sizeof(*c));
  c->n_mel = 128;
  c->sampling_rate = 16000;
  c->frame_length_ms = 20.0;
  c->hop_length_ms = 10.0;
  c->min_frequency = 0.0;
  c->max_frequency = 8000.0;
  c->preemphasis = 0.0;
  c->preemphasis_htk = 1;
  c->fft_overdrive = 0;
  c->input_scale = 1.0;
  c->mel_floor = 1e-3;
  c->max_samples = 480000;
  c->pad_multiple = 128;
  derive(c);
}

/* ---- config --------------------------------------------------------------------------- */

static int num(json_t *o, const char *key, double lo, double hi, int integer, double *out,
               char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v))
    return cm_fail(err, errlen, CM_ERR_INVAL, "feature extractor: %s must be a number", key);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return cm_fail(err, errlen, CM_ERR_INVAL, "feature extractor: %s = %g outside [%g, %g]", key, x,
                   lo, hi);
  if (integer && x != floor(x))
    return cm_fail(err, errlen, CM_ERR_INVAL, "feature extractor: %s must be an integer", key);
  *out = x;
  return 0;
}

static int flag(json_t *o, const char *key, int *out, char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v))
    return cm_fail(err, errlen, CM_ERR_INVAL, "feature extractor: %s must be true or false", key);
  *out = json_is_true(v);
  return 0;
}

static int per_bin(json_t *o, const char *key, int n_mel, int nonzero, double *out, int *has,
                   char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_array(v) || json_array_size(v) != (size_t)n_mel)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "feature extractor: %s must be a list of feature_size (%d) numbers", key, n_mel);
  for (int i = 0; i < n_mel; i++) {
    json_t *e = json_array_get(v, (size_t)i);
    if (!json_is_number(e) || !isfinite(json_number_value(e)) ||
        (nonzero && json_number_value(e) == 0))
      return cm_fail(err, errlen, CM_ERR_INVAL, "feature extractor: %s[%d] must be a %snumber", key,
                     i, nonzero ? "non-zero " : "");
    out[i] = json_number_value(e);
  }
  *has = 1;
  return 0;
}

int md_audio_fe_parse(const char *json, size_t len, struct md_audio_fe_cfg *c, char *err,
                      size_t errlen) {
  md_audio_fe_defaults(c);
  json_error_t je;
  json_t *root = json_loadb(json, len, 0, &je);
  if (!root || !json_is_object(root)) {
    json_decref(root);
    return cm_fail(err, errlen, CM_ERR_INVAL, "feature extractor: not a JSON object");
  }
  json_t *o = json_object_get(root, "feature_extractor");
  if (!json_is_object(o)) o = root;
  double x;
  int rc = 0;
#define NUM(key, lo, hi, dst)                                                                      \
  do {                                                                                             \
    x = (double)(dst);                                                                             \
    if (!rc && !(rc = num(o, key, lo, hi, 0, &x, err, errlen))) dst = x;                           \
  } while (0)
#define INT(key, lo, hi, dst)                                                                      \
  do {                                                                                             \
    x = (double)(dst);                                                                             \
    if (!rc && !(rc = num(o, key, lo, hi, 1, &x, err, errlen))) dst = (int)x;                      \
  } while (0)
  INT("feature_size", 1, MD_AUDIO_MAX_MEL, c->n_mel);
  INT("sampling_rate", 1000, 768000, c->sampling_rate);
  NUM("frame_length_ms", 1, 1000, c->frame_length_ms);
  NUM("hop_length_ms", 0.1, 1000, c->hop_length_ms);
  NUM("min_frequency", 0, 384000, c->min_frequency);
  NUM("max_frequency", 0, 384000, c->max_frequency);
  NUM("preemphasis", 0, 1, c->preemphasis);
  NUM("input_scale_factor", -1e9, 1e9, c->input_scale);
  NUM("mel_floor", 1e-30, 1e9, c->mel_floor);
  INT("max_length", 1, 1e8, c->max_samples);
  INT("pad_to_multiple_of", 1, 1e6, c->pad_multiple);
  double dither = 0;
  NUM("dither", 0, 1e9, dither);
#undef NUM
#undef INT
  if (!rc) rc = flag(o, "preemphasis_htk_flavor", &c->preemphasis_htk, err, errlen);
  if (!rc) rc = flag(o, "fft_overdrive", &c->fft_overdrive, err, errlen);
  if (!rc && dither != 0)
    rc = cm_fail(err, errlen, CM_ERR_UNSUPPORTED,
                 "feature extractor: dither = %g is not supported (random noise; 0 only)", dither);
  if (!rc && c->max_frequency <= c->min_frequency)
    rc = cm_fail(err, errlen, CM_ERR_INVAL,
                 "feature extractor: max_frequency must be above min_frequency");
  if (!rc && c->max_frequency > c->sampling_rate / 2.0)
    rc = cm_fail(err, errlen, CM_ERR_INVAL,
                 "feature extractor: max_frequency is above half the sampling_rate");
  if (!rc) rc = per_bin(o, "per_bin_mean", c->n_mel, 0, c->mean, &c->has_mean, err, errlen);
  if (!rc) rc = per_bin(o, "per_bin_stddev", c->n_mel, 1, c->stddev, &c->has_stddev, err, errlen);
  json_decref(root);
  if (rc) return rc;
  derive(c);
  if (c->frame_length < 2 || c->hop_length < 1)
    return cm_fail(err, errlen, CM_ERR_INVAL,
                   "feature extractor: frame or hop shorter than a sample");
  return 0;
}

/* ---- features ------------------------------------------------------------------------ */

size_t md_audio_fe_samples(const struct md_audio_fe_cfg *c, size_t n) {
  return n > (size_t)c->max_samples ? (size_t)c->max_samples : n;
}

static size_t padded(const struct md_audio_fe_cfg *c, size_t n) {
  size_t m = (size_t)c->pad_multiple;
  n = md_audio_fe_samples(c, n);
  return (n + m - 1) / m * m;
}

size_t md_audio_fe_frames(const struct md_audio_fe_cfg *c, size_t n) {
  size_t len = padded(c, n) + (size_t)(c->frame_length / 2), win = (size_t)c->frame_length + 1;
  return len < win ? 0 : (len - win) / (size_t)c->hop_length + 1;
}

static double hz_to_mel(double f) {
  return 2595.0 * log10(1.0 + f / 700.0);
}
static double mel_to_hz(double m) {
  return 700.0 * (pow(10.0, m / 2595.0) - 1.0);
}

/* In-place radix-2 FFT of re/im[0..n), n a power of two. */
static void fft(double *re, double *im, int n) {
  for (int i = 1, j = 0; i < n; i++) {
    int bit = n >> 1;
    for (; j & bit; bit >>= 1)
      j ^= bit;
    j ^= bit;
    if (i < j) {
      double t = re[i];
      re[i] = re[j], re[j] = t;
      t = im[i], im[i] = im[j], im[j] = t;
    }
  }
  for (int len = 2; len <= n; len <<= 1) {
    double ang = -2.0 * M_PI / len;
    for (int k = 0; k < len / 2; k++) {
      double wr = cos(ang * k), wi = sin(ang * k);
      for (int s = 0; s < n; s += len) {
        int a = s + k, b = s + k + len / 2;
        double xr = re[b] * wr - im[b] * wi, xi = re[b] * wi + im[b] * wr;
        re[b] = re[a] - xr, im[b] = im[a] - xi;
        re[a] += xr, im[a] += xi;
      }
    }
  }
}

int md_audio_features(const struct md_audio_fe_cfg *c, const float *pcm, size_t n, float *feat,
                      uint8_t *mask) {
  size_t n_real = md_audio_fe_samples(c, n), nf = md_audio_fe_frames(c, n);
  size_t pad_left = (size_t)(c->frame_length / 2), len = padded(c, n) + pad_left;
  int fl = c->frame_length, hop = c->hop_length, nfft = c->fft_length, nb = nfft / 2 + 1;
  int nm = c->n_mel;
  double *x = calloc(len ? len : 1, sizeof(double));
  double *filt = calloc((size_t)nb * (size_t)nm, sizeof(double)); /* [bin][mel] */
  double *win = malloc((size_t)fl * sizeof(double));
  double *re = malloc((size_t)nfft * sizeof(double)), *im = malloc((size_t)nfft * sizeof(double));
  double *mag = malloc((size_t)nb * sizeof(double));
  double *edges = malloc((size_t)(nm + 2) * sizeof(double));
  int rc = 0;
  if (!x || !filt || !win || !re || !im || !mag || !edges) {
    rc = CM_ERR_NOMEM;
    goto out;
  }
  for (size_t i = 0; i < n_real; i++)
    x[pad_left + i] = (double)pcm[i] * c->input_scale;
  for (int i = 0; i < fl; i++)
    win[i] = 0.5 - 0.5 * cos(2.0 * M_PI * i / fl);
  /* filter edges evenly spaced in mel, bins at k * (sr // 2) / (nb - 1) Hz */
  double m0 = hz_to_mel(c->min_frequency), m1 = hz_to_mel(c->max_frequency);
  for (int i = 0; i < nm + 2; i++)
    edges[i] = mel_to_hz(m0 + (m1 - m0) * i / (nm + 1));
  for (int k = 0; k < nb; k++) {
    double f = (double)(c->sampling_rate / 2) * k / (nb - 1);
    for (int m = 0; m < nm; m++) {
      double down = (f - edges[m]) / (edges[m + 1] - edges[m]);
      double up = (edges[m + 2] - f) / (edges[m + 2] - edges[m + 1]);
      double v = fmin(down, up);
      filt[(size_t)k * (size_t)nm + (size_t)m] = v > 0 ? v : 0;
    }
  }
  double p = c->preemphasis;
  for (size_t t = 0; t < nf; t++) {
    const double *s = x + t * (size_t)hop; /* fl + 1 samples */
    for (int i = 0; i < nfft; i++)
      re[i] = im[i] = 0;
    for (int i = 0; i < fl; i++) {
      double v;
      if (p <= 0)
        v = s[i];
      else if (c->preemphasis_htk)
        v = i == 0 ? s[0] * (1.0 - p) : s[i] - p * s[i - 1];
      else
        v = s[i + 1] - p * s[i];
      re[i] = v * win[i];
    }
    fft(re, im, nfft);
    for (int k = 0; k < nb; k++)
      mag[k] = sqrt(re[k] * re[k] + im[k] * im[k]);
    int valid = t * (size_t)hop + (size_t)fl - pad_left < n_real;
    mask[t] = (uint8_t)valid;
    for (int m = 0; m < nm; m++) {
      double acc = 0;
      for (int k = 0; k < nb; k++)
        acc += mag[k] * filt[(size_t)k * (size_t)nm + (size_t)m];
      double v = log(acc + c->mel_floor);
      if (c->has_mean) v -= c->mean[m];
      if (c->has_stddev) v /= c->stddev[m];
      feat[t * (size_t)nm + (size_t)m] = valid ? (float)v : 0.0f;
    }
  }
out:
  free(x), free(filt), free(win), free(re), free(im), free(mag), free(edges);
  return rc;
}

int md_audio_soft_tokens(const uint8_t *mask, size_t n_frames) {
  /* each stride-2 convolution (kernel 3, padding 1) keeps entries 0, 2, 4, ...;
   * twice: every fourth entry */
  int count = 0;
  for (size_t i = 0; i < n_frames; i += 4)
    count += mask[i] != 0;
  return count;
}

int md_audio_fe_load(const char *dir, struct md_audio_fe_cfg *c, char *err, size_t errlen) {
  md_audio_fe_defaults(c);
  struct stat sb;
  if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) return 0; /* a GGUF model file: defaults */
  static const char *const files[] = {"processor_config.json", "preprocessor_config.json"};
  for (int f = 0; f < 2; f++) {
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/%s", dir, files[f]);
    int rc = md_read_file(path, 16u << 20, &text, &len);
    if (rc == CM_ERR_NOENT) continue;
    if (rc) return cm_fail(err, errlen, rc, "%s: %s", path, cm_strerror(rc));
    json_t *root = json_loadb(text, len, 0, NULL);
    /* the newer layout nests it; the older file is the extractor's when it says so */
    int ours =
        json_is_object(root) && (json_is_object(json_object_get(root, "feature_extractor")) ||
                                 (f == 1 && json_object_get(root, "feature_extractor_type")));
    json_decref(root);
    char why[256] = "";
    rc = ours ? md_audio_fe_parse(text, len, c, why, sizeof(why)) : 0;
    free(text);
    if (rc) return cm_fail(err, errlen, rc, "%s: %s", path, why);
    if (ours) return 0;
  }
  return 0;
}

size_t md_audio_fe_max_frames(const struct md_audio_fe_cfg *c) {
  return md_audio_fe_frames(c, (size_t)c->max_samples);
}

int md_audio_fe_max_tokens(const struct md_audio_fe_cfg *c) {
  /* the longest clip's valid frames are a prefix (md_audio_features' rule);
   * md_audio_soft_tokens keeps every fourth of them, the first included */
  size_t nf = md_audio_fe_max_frames(c), valid = 0, n = (size_t)c->max_samples;
  size_t fl = (size_t)c->frame_length;
  for (size_t i = 0; i < nf; i++)
    valid += i * (size_t)c->hop_length + fl - fl / 2 < n;
  return (int)((valid + 3) / 4);
}
