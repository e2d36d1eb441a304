/* fe-image.h — image inputs of the OpenAI chat API: the `url` of a content
 * part {"type":"image_url","image_url":{"url":...}} turned into 8-bit
 * interleaved RGB pixels. Only fetching the bytes and decoding happen here;
 * resizing and normalizing are the caller's. The calls block (file reads,
 * decoding), so the server runs them on libuv's thread pool; they mutate no
 * globals and are safe to call from several threads at once.
 *
 * URLs:
 *   data:[<mediatype>][;base64],<payload>   base64 required; the mediatype is
 *       ignored (the type is sniffed from the bytes). Strict base64: the
 *       standard alphabet only, `=` padding optional but correct when present,
 *       no whitespace; the offset of a bad character is named.
 *   file:///path, file://localhost/path      only with --allowed-local-media-path
 *       (limits.local_dir): the path is percent-decoded, resolved with
 *       realpath() and must name a regular file strictly inside that folder
 *       (symlinks that lead out are refused). A missing file and a file outside
 *       the folder get the same answer, so the server does not tell clients
 *       what exists elsewhere on the machine.
 *   http://, https://                          refused: this server fetches
 *       nothing from the network.
 *
 * Formats, sniffed from magic bytes (never from a declared type): PNG
 * (libpng), JPEG (libjpeg-turbo), WebP (libwebp; an animated file gives its
 * first frame) and GIF (giflib; first frame only). Decompression bombs are
 * refused from the header, before any pixel buffer exists: width*height over
 * max_pixels or a side over FE_IMAGE_MAX_SIDE is CM_ERR_TOOBIG.
 *
 * Conversion to RGB follows Pillow's Image.convert("RGB"), which is what the
 * Python reference preprocessing sees, with the exceptions noted:
 *   gray                replicated into R, G and B (1/2/4-bit gray scaled to 0..255)
 *   palette             expanded through the palette
 *   alpha, tRNS         DROPPED, not composited: a transparent pixel keeps the
 *                       color stored under it
 *   16-bit samples      the high byte (libpng's png_set_strip_16, v >> 8), which
 *                       is what Pillow's "RGB;16B"/"RGBA;16B"/"LA;16B" unpackers
 *                       do. Exception: Pillow opens 16-bit gray as mode I;16 and
 *                       then saturates every value above 255 to white; we take
 *                       the high byte there too (a usable image instead of a
 *                       white one).
 *   CMYK / YCCK JPEG    Pillow reads every 4-component JPEG as Adobe-inverted
 *                       CMYK ("CMYK;I") and converts with R = nk - nk*C'/255
 *                       (rounded), nk = 255 - K', where C' = 255 - c and
 *                       K' = 255 - k are the inverted decoded samples; the same
 *                       for G (M) and B (Y). In libjpeg's terms: R ~ c*k/255.
 *                       No ICC profile is applied (Pillow does not either).
 *   GIF, first frame    painted at its offset onto the logical-screen canvas
 *                       (grown to hold the frame when the frame sticks out, as
 *                       Pillow grows it). The canvas starts as the background
 *                       color when a global color map holds that index, else
 *                       black; pixels of the frame's transparent index show the
 *                       canvas. (Pillow instead shows the transparent index's
 *                       palette color there.) A frame without any color map
 *                       reads its indices as gray levels, as Pillow's "L" mode.
 *   EXIF orientation    not applied (Pillow's convert does not either).
 *   gamma, ICC          not applied.
 *
 * Errors are one line in err, written for the client (the caller prefixes the
 * part's name): CM_ERR_INVAL (bad URL, bad base64, empty or zero-size image,
 * a file:// path that is not a regular file), CM_ERR_NOENT (a file:// path
 * that names no file inside the allowed folder, or one outside it),
 * CM_ERR_UNSUPPORTED (remote URL, file:// not enabled, unknown image type),
 * CM_ERR_TOOBIG (bytes or pixels over the limits), CM_ERR_TRUNC (the image
 * data ends early), CM_ERR_PARSE (corrupt image), CM_ERR_IO, CM_ERR_NOMEM.
 * CM_ERR_NOMEM. Nothing is ever written to stderr. */
#ifndef LMSERVE_FE_IMAGE_H
#define LMSERVE_FE_IMAGE_H
#include <stddef.h>
#include <stdint.h>

#define FE_IMAGE_DEFAULT_MAX_BYTES  ((size_t)20 << 20) /* bytes */
#define FE_IMAGE_DEFAULT_MAX_PIXELS ((uint64_t)40000000)
#define FE_IMAGE_MAX_SIDE           65536 /* pixels; a wider or taller image is refused */

struct fe_image_limits {
  size_t max_bytes;      /* encoded bytes per image (after base64 decoding); 0 = 20 MiB */
  uint64_t max_pixels;   /* width*height refused above this before any pixel buffer is
                            allocated (decompression bombs); 0 = 40e6 */
  const char *local_dir; /* --allowed-local-media-path: file:// URLs allowed only for files
                            inside it; NULL = file:// refused */
};

struct fe_image {
  uint8_t *rgb; /* (h, w, 3) bytes, rows packed (stride w*3); malloc'd, owned by the image */
  int w, h;     /* pixels */
};

/* Loads and decodes the image that `url` names. url is url_len bytes, not
 * necessarily NUL-terminated. lim may be NULL (all defaults: file:// refused).
 * Returns 0 with *out filled (free it with fe_image_free), or a negative
 * cm_err with *out zeroed and a one-line reason in err[errlen]. */
int fe_image_load_url(const char *url, size_t url_len, const struct fe_image_limits *lim,
                      struct fe_image *out, char *err, size_t errlen);

/* Decodes encoded image bytes already in memory (data[0..n) is only read).
 * Same returns as fe_image_load_url. */
int fe_image_decode(const uint8_t *data, size_t n, const struct fe_image_limits *lim,
                    struct fe_image *out, char *err, size_t errlen);

/* Frees the pixels and zeroes *img. NULL-safe and idempotent. */
void fe_image_free(struct fe_image *img);

#endif
