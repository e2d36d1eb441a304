/* md-audio-g4.h — Gemma 4's audio front end: 16 kHz mono samples → log-mel
 * features, as transformers' Gemma4AudioFeatureExtractor
 * (models/gemma4/feature_extraction_gemma4.py) computes them, and the number
 * of audio soft tokens Gemma4Processor (processing_gemma4.py,
 * replace_audio_token) writes for them.
 *
 *   struct md_audio_fe_cfg c;
 *   md_audio_fe_defaults(&c);                 // or md_audio_fe_parse(json, ...)
 *   size_t nf = md_audio_fe_frames(&c, n);    // rows of features
 *   md_audio_features(&c, pcm, n, feat, mask); // feat [nf][c.n_mel], mask [nf]
 *   int tokens = md_audio_soft_tokens(mask, nf);
 *
 * What the extractor does, step by step (its defaults in brackets):
 *   - truncation to max_length samples [480000 = 30 s], then zero padding on
 *     the right to a multiple of pad_to_multiple_of [128] (SequenceFeatureExtractor.pad
 *     with padding "longest" on one input); the real samples are marked valid;
 *   - input_scale_factor [1] multiplies the samples; dither [0] is refused
 *     when not 0 (random noise would make features irreproducible);
 *   - "semicausal" padding: frame_length/2 zeros in front;
 *   - frames of frame_length + 1 samples every hop_length samples
 *     (frame_length = round(sr * frame_length_ms / 1000) [320],
 *     hop = round(sr * hop_length_ms / 1000) [160]); preemphasis [0]: the
 *     first frame_length samples of each frame; otherwise the HTK flavour
 *     (first sample x (1 - p), then x[i] - p x[i-1]) or the plain one
 *     (x[i+1] - p x[i]);
 *   - times a periodic Hann window of frame_length (0.5 - 0.5 cos(2 pi n / N));
 *   - real FFT of fft_length = 2^ceil(log2(frame_length)) [512] (twice that
 *     with fft_overdrive), zero padded; the MAGNITUDE |X_k| (not the power)
 *     of bins 0..fft_length/2;
 *   - a triangular mel filter bank without normalisation on the HTK scale
 *     (mel = 2595 log10(1 + f/700)), feature_size [128] filters between
 *     min_frequency [0] and max_frequency [8000] Hz, bin k at
 *     k * (sr // 2) / (fft_length / 2) Hz (transformers' mel_filter_bank,
 *     audio_utils.py);
 *   - log(mel + mel_floor [1e-3]); minus per_bin_mean and over
 *     per_bin_stddev when given;
 *   - frame i is valid when the last sample of its window is real audio
 *     (i*hop + frame_length - frame_length/2 < n); invalid frames are zero.
 * Everything is computed in double (our own radix-2 FFT) and stored as float.
 *
 * Soft tokens: the two stride-2 convolutions of the encoder keep every
 * second mask entry twice; the count is the valid entries left (at 16 kHz,
 * 25 per second of audio). */
#ifndef LMSERVE_MD_AUDIO_G4_H
#define LMSERVE_MD_AUDIO_G4_H
#include <stddef.h>
#include <stdint.h>

#define MD_AUDIO_MAX_MEL 512

struct md_audio_fe_cfg {
  int n_mel;         /* feature_size */
  int sampling_rate; /* Hz */
  double frame_length_ms, hop_length_ms;
  double min_frequency, max_frequency; /* Hz */
  double preemphasis;
  int preemphasis_htk; /* preemphasis_htk_flavor */
  int fft_overdrive;
  double input_scale; /* input_scale_factor */
  double mel_floor;
  int max_samples;  /* max_length (the call's default, 480000) */
  int pad_multiple; /* pad_to_multiple_of (128) */
  int has_mean, has_stddev;
  double mean[MD_AUDIO_MAX_MEL], stddev[MD_AUDIO_MAX_MEL]; /* per_bin_mean, per_bin_stddev */
  /* derived (md_audio_fe_defaults / md_audio_fe_parse set them) */
  int frame_length, hop_length, fft_length; /* samples */
};

/* Gemma4AudioFeatureExtractor's defaults. */
void md_audio_fe_defaults(struct md_audio_fe_cfg *c);

/* The extractor's fields from a JSON object: a preprocessor_config.json, or
 * a processor_config.json whose "feature_extractor" member holds them. Absent
 * fields keep their defaults; a bad one is CM_ERR_INVAL (dither other than 0:
 * CM_ERR_UNSUPPORTED) naming it. */
int md_audio_fe_parse(const char *json, size_t len, struct md_audio_fe_cfg *c, char *err,
                      size_t errlen);

/* The extractor of the checkpoint in DIR: processor_config.json's
 * "feature_extractor" (transformers' newer layout), else a
 * preprocessor_config.json that is a feature extractor's (it names a
 * "feature_extractor_type"), else the defaults (and for a GGUF model named
 * as its file, whose mmproj file holds only the mel bins). 0 or a negative cm_err with
 * the reason (naming the file) in err. */
int md_audio_fe_load(const char *dir, struct md_audio_fe_cfg *c, char *err, size_t errlen);

/* Samples the extractor takes of n (after truncation to max_samples). */
size_t md_audio_fe_samples(const struct md_audio_fe_cfg *c, size_t n);

/* Rows of features for n samples (after truncation and padding). */
size_t md_audio_fe_frames(const struct md_audio_fe_cfg *c, size_t n);

/* The features of pcm[0..n) (16 kHz mono): feat [frames][n_mel] and mask
 * [frames] (1: valid), frames = md_audio_fe_frames(c, n). 0 or CM_ERR_NOMEM. */
int md_audio_features(const struct md_audio_fe_cfg *c, const float *pcm, size_t n, float *feat,
                      uint8_t *mask);

/* The audio soft tokens for a features mask of n_frames rows. */
int md_audio_soft_tokens(const uint8_t *mask, size_t n_frames);

/* The longest clip the extractor takes (max_samples): its feature frames and
 * soft tokens (Gemma 4's defaults: 2999 and 750). */
size_t md_audio_fe_max_frames(const struct md_audio_fe_cfg *c);
int md_audio_fe_max_tokens(const struct md_audio_fe_cfg *c);

#endif
