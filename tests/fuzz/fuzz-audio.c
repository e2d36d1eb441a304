/* fuzz-audio.c — fuzz target for the audio inputs of the chat API
 * (frontend/fe-audio.c): the first byte picks the declared format (even:
 * "wav", odd: "mp3"), the rest goes through fe_audio_decode as encoded bytes
 * and through fe_audio_decode_b64 as a part's base64 data. The seeds are small
 * WAV and MP3 files (mono and stereo, 8 and 16 kHz, PCM and float). Each call
 * must return 0 with 16 kHz samples within the limits or a negative cm_err
 * with a one-line reason and no samples; any other outcome aborts (a finding). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-audio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int rc, struct fe_audio *a, const char *err, double max_seconds) {
  if (rc == 0) {
    if (!a->pcm || a->n == 0 || a->rate != 16000 || a->seconds > max_seconds ||
        a->n > (size_t)(max_seconds * 16000) + 16)
      abort();
    volatile float sink = a->pcm[a->n - 1]; /* all of it exists */
    (void)sink;
  } else if (rc > 0 || rc <= CM_ERR__LAST || a->pcm || !err[0] || strchr(err, '\n')) {
    abort();
  }
  fe_audio_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  /* small limits keep each run fast; the limits themselves are tested elsewhere */
  const struct fe_audio_limits lim = {1 << 20, 2.0};
  const char *format = data[0] & 1 ? "mp3" : "wav";
  struct fe_audio a;
  char err[256] = "";
  check(fe_audio_decode(data + 1, size - 1, format, &lim, 16000, &a, err, sizeof(err)), &a, err,
        lim.max_seconds);
  err[0] = 0;
  check(fe_audio_decode_b64((const char *)data + 1, size - 1, format, &lim, 16000, &a, err,
                            sizeof(err)),
        &a, err, lim.max_seconds);
  return 0;
}
