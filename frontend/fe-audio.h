/* fe-audio.h — audio inputs of the OpenAI chat API: the `input_audio` content
 * part {"type":"input_audio","input_audio":{"data": BASE64, "format": "wav"|"mp3"}}
 * turned into 16 kHz mono float samples, which the feature extractor
 * (model/md-audio-g4.h) takes. Only decoding, downmixing and resampling happen
 * here. The calls block, so the server runs them on libuv's thread pool; they
 * mutate no globals and are safe to call from several threads at once.
 *
 *   struct fe_audio a;
 *   fe_audio_decode_b64(data, len, "wav", &lim, 16000, &a, err, sizeof err);
 *   ... a.pcm[0..a.n) ...
 *   fe_audio_free(&a);
 *
 * Decoders (Debian's, never our own: parsing audio containers is
 * security-sensitive code):
 *   wav  libsndfile (RIFF/WAVE, WAVE_FORMAT_EXTENSIBLE and RF64; PCM 8-32 bit,
 *        float, A-law, mu-law, IMA/MS ADPCM, GSM — whatever libsndfile reads
 *        inside a WAV container), through its virtual I/O on the bytes in memory
 *   mp3  libmpg123 in feeder mode, float output (MPEG 1/2/2.5 layers I-III)
 * The declared format is checked against the bytes: WAV data sent as "mp3", or
 * MP3/other data sent as "wav", is refused naming what the bytes look like.
 *
 * Then, as librosa.load(..., sr=16000, mono=True) does (what vLLM's audio
 * inputs go through): channels averaged to mono, then resampled with libsoxr's
 * HQ recipe (SOXR_HQ) — the library and recipe behind librosa's default
 * res_type "soxr_hq". A stream at the target rate is copied, not resampled.
 *
 * Truncation: a WAV whose data chunk declares more bytes than the data holds
 * (a data size of 0 or 0xFFFFFFFF, streaming writers' "unknown", is read to the
 * end), or that libsndfile reads short; an MP3 whose last frame header is
 * followed by fewer bytes than its frame needs. Both are CM_ERR_TRUNC.
 *
 * Errors are one line in err, written for the client (the caller prefixes the
 * part's name): CM_ERR_INVAL (bad base64, empty data, data that is not audio of
 * the declared format, no audio frames), CM_ERR_UNSUPPORTED (a format other
 * than wav/mp3, a sample rate or channel count out of range), CM_ERR_TOOBIG
 * (bytes over max_bytes, audio longer than max_seconds: known from a WAV's
 * header before any sample is read, and an MP3 stops decoding there),
 * CM_ERR_TRUNC, CM_ERR_PARSE (the decoder's own complaint), CM_ERR_NOMEM.
 * Nothing is ever written to stderr. */
#ifndef LMSERVE_FE_AUDIO_H
#define LMSERVE_FE_AUDIO_H
#include <stddef.h>
#include <stdint.h>

#define FE_AUDIO_DEFAULT_MAX_BYTES ((size_t)32 << 20) /* bytes, after base64 decoding */
#define FE_AUDIO_DEFAULT_MAX_SECONDS                                                               \
  30.0                               /* Gemma 4's cap (its feature extractor's 480000 samples) */
#define FE_AUDIO_MIN_RATE     1000   /* Hz; a slower stream is refused */
#define FE_AUDIO_MAX_RATE     768000 /* Hz; a faster stream is refused */
#define FE_AUDIO_MAX_CHANNELS 64

struct fe_audio_limits {
  size_t max_bytes;   /* encoded bytes (after base64 decoding); 0 = 32 MiB */
  double max_seconds; /* duration; 0 = 30 s */
};

struct fe_audio {
  float *pcm; /* n samples, mono, at `rate`; malloc'd, owned by the audio */
  size_t n;
  int rate;         /* Hz of pcm (the rate asked for) */
  int src_rate;     /* Hz of the stream as sent */
  int src_channels; /* channels as sent (averaged into pcm) */
  double seconds;   /* duration of the stream as sent */
};

/* Decodes the audio in data[0..n) as `format` ("wav" or "mp3", exactly),
 * mono, resampled to `rate` Hz. lim may be NULL (defaults). 0 with *out
 * filled (free it with fe_audio_free), or a negative cm_err with *out zeroed
 * and a one-line reason in err[errlen]. */
int fe_audio_decode(const uint8_t *data, size_t n, const char *format,
                    const struct fe_audio_limits *lim, int rate, struct fe_audio *out, char *err,
                    size_t errlen);

/* The same from the part's base64 `data` (b64[0..len), standard alphabet,
 * '=' padding optional but correct when present, no whitespace; a bare
 * "data:...;base64," prefix is also taken, as some clients send one). */
int fe_audio_decode_b64(const char *b64, size_t len, const char *format,
                        const struct fe_audio_limits *lim, int rate, struct fe_audio *out,
                        char *err, size_t errlen);

/* Frees the samples and zeroes *a. NULL-safe and idempotent. */
void fe_audio_free(struct fe_audio *a);

#endif
