/* tk-chat.c — loading a checkpoint's chat template and rendering messages
 * with it (see tk-chat.h). */
#include "tokenizer/tk-chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm-err.h"
#include "tokenizer/tk-jinja.h"

struct tk_chat {
  struct tk_jinja *tmpl;
  json_t *tokens; /* {"bos_token": "<bos>", ...} */
  char *src;      /* the template's text (NUL-terminated) */
  size_t src_len;
};

void tk_chat_free(struct tk_chat *c) {
  if (!c) return;
  free(c->src);
  tk_jinja_free(c->tmpl);
  json_decref(c->tokens);
  free(c);
}

const char *tk_chat_source(const struct tk_chat *c, size_t *len) {
  *len = c->src_len;
  return c->src;
}

/* Collects the *_token entries of a tokenizer_config object. */
static json_t *special_tokens(json_t *config) {
  json_t *out = json_object();
  const char *k;
  json_t *v;
  if (!out || !json_is_object(config)) return out;
  json_object_foreach(config, k, v) {
    size_t kl = strlen(k);
    if (kl < 6 || strcmp(k + kl - 6, "_token")) continue;
    json_t *s = json_is_object(v) ? json_object_get(v, "content") : v;
    if (json_is_string(s)) json_object_set(out, k, s);
  }
  return out;
}

int tk_chat_from_string(const char *tmpl, size_t len, json_t *config, struct tk_chat **out,
                        char *errbuf, size_t errlen) {
  struct tk_chat *c = calloc(1, sizeof *c);
  if (!c) return CM_ERR_NOMEM;
  int rc = tk_jinja_parse(tmpl, len, &c->tmpl, errbuf, errlen);
  if (!rc && !(c->tokens = special_tokens(config))) rc = CM_ERR_NOMEM;
  if (!rc && !(c->src = malloc(len + 1))) rc = CM_ERR_NOMEM;
  if (!rc) {
    memcpy(c->src, tmpl, len);
    c->src[len] = 0;
    c->src_len = len;
  }
  if (rc) {
    tk_chat_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && n < (1L << 26) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
      if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
      } else {
        buf[n] = 0;
        *len = (size_t)n;
      }
    }
  }
  fclose(f);
  return buf;
}

int tk_chat_template_arg(const char *value, char **out, char *errbuf, size_t errlen) {
  size_t len = 0;
  struct stat sb;
  *out = NULL;
  int there = stat(value, &sb) == 0;
  if (there && S_ISREG(sb.st_mode)) {
    if (!(*out = read_file(value, &len))) {
      if (errbuf) snprintf(errbuf, errlen, "--chat-template %s: cannot read the file", value);
      return CM_ERR_IO;
    }
    return 0;
  }
  if (!strpbrk(value, "{}\n")) {
    if (errbuf)
      snprintf(errbuf, errlen,
               "--chat-template %s: %s (and not a template: it has no '{', '}' or newline)", value,
               there ? "not a file" : "no such file");
    return CM_ERR_NOENT;
  }
  return (*out = strdup(value)) ? 0 : CM_ERR_NOMEM;
}

int tk_chat_load(const char *path, struct tk_chat **out, char *errbuf, size_t errlen) {
  char cfg_path[4096], jinja_path[4096];
  struct stat sb;
  int is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
  snprintf(cfg_path, sizeof cfg_path, is_dir ? "%s/tokenizer_config.json" : "%s", path);
  jinja_path[0] = 0;
  if (is_dir) snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", path);
  json_error_t je;
  json_t *cfg = json_load_file(cfg_path, 0, &je);
  if (!cfg) {
    int missing = stat(cfg_path, &sb) != 0;
    if (errbuf) snprintf(errbuf, errlen, "%s: %s", cfg_path, missing ? "no such file" : je.text);
    return missing ? CM_ERR_NOENT : CM_ERR_PARSE;
  }
  int rc;
  size_t len = 0;
  char *file_tmpl = jinja_path[0] ? read_file(jinja_path, &len) : NULL;
  const char *tmpl = file_tmpl;
  if (!tmpl) {
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_array(ct)) {
      size_t i;
      json_t *e;
      json_t *found = NULL;
      json_array_foreach(ct, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && !strcmp(name, "default")) found = json_object_get(e, "template");
      }
      ct = found;
    }
    if (!json_is_string(ct)) {
      if (errbuf) snprintf(errbuf, errlen, "%s: no chat_template", cfg_path);
      json_decref(cfg);
      return CM_ERR_NOENT;
    }
    tmpl = json_string_value(ct);
    len = json_string_length(ct);
  }
  rc = tk_chat_from_string(tmpl, len, cfg, out, errbuf, errlen);
  free(file_tmpl);
  json_decref(cfg);
  return rc;
}

int tk_chat_render(const struct tk_chat *c, json_t *messages, int add_generation_prompt,
                   json_t *extra, char **out, size_t *out_len, char *errbuf, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  if (!json_is_array(messages)) {
    if (errbuf) snprintf(errbuf, errlen, "messages must be an array");
    return CM_ERR_INVAL;
  }
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    json_t *content = json_object_get(m, "content");
    if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
      if (errbuf) snprintf(errbuf, errlen, "messages[%zu] needs a string role", i);
      return CM_ERR_INVAL;
    }
    if (content && !json_is_string(content) && !json_is_array(content) && !json_is_null(content)) {
      if (errbuf) snprintf(errbuf, errlen, "messages[%zu].content must be a string or a list", i);
      return CM_ERR_INVAL;
    }
  }
  json_t *vars = json_deep_copy(c->tokens);
  if (!vars) return CM_ERR_NOMEM;
  /* as Hugging Face passes them: tools and documents are None unless given */
  json_object_set_new(vars, "tools", json_null());
  json_object_set_new(vars, "documents", json_null());
  if (json_is_object(extra)) json_object_update(vars, extra);
  json_object_set(vars, "messages", messages);
  json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
  int rc = tk_jinja_render(c->tmpl, vars, out, out_len, errbuf, errlen);
  json_decref(vars);
  return rc;
}
