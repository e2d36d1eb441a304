/* md-lora-list.c — --lora-modules entries and the sum of their list. */
#include "model/md-lora-list.h"

#include <string.h>

#include "common/cm-args.h"
#include "common/cm-err.h"
#include "common/cm-hash.h"

static int name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         strchr("._:/@+-", c) != NULL;
}

int md_lora_module_parse(const char *arg, struct md_lora_module *out, char *err, size_t errlen) {
  const char *eq = strchr(arg, '=');
  size_t n = eq ? (size_t)(eq - arg) : 0;
  if (!eq || !n || !eq[1])
    return cm_fail(err, errlen, CM_ERR_INVAL, "--lora-modules '%s': expected NAME=PATH", arg);
  if (n >= MD_LORA_NAME_MAX)
    return cm_fail(err, errlen, CM_ERR_INVAL, "--lora-modules: a name of %zu bytes (at most %d)", n,
                   MD_LORA_NAME_MAX - 1);
  for (size_t i = 0; i < n; i++)
    if (!name_char(arg[i]))
      return cm_fail(err, errlen, CM_ERR_INVAL,
                     "--lora-modules '%.*s': a name takes letters, digits and ._:/@+-", (int)n,
                     arg);
  if (strlen(eq + 1) >= sizeof(out->path))
    return cm_fail(err, errlen, CM_ERR_INVAL, "--lora-modules %.*s: the path is too long", (int)n,
                   arg);
  memcpy(out->name, arg, n);
  out->name[n] = '\0';
  strcpy(out->path, eq + 1);
  return 0;
}

int md_lora_modules(const struct cm_strs *args, struct md_lora_module *out, char *err,
                    size_t errlen) {
  for (int i = 0; i < args->n; i++) {
    int rc = md_lora_module_parse(args->v[i], &out[i], err, errlen);
    if (rc) return rc;
    for (int j = 0; j < i; j++)
      if (!strcmp(out[j].name, out[i].name))
        return cm_fail(err, errlen, CM_ERR_INVAL, "--lora-modules: the name %s is given twice",
                       out[i].name);
  }
  return args->n;
}

uint64_t md_lora_list_sum(const struct md_lora_module *mods, int n) {
  uint64_t h = 0;
  for (int i = 0; i < n; i++) {
    h = cm_mix64(h ^ (uint64_t)(i + 1));
    for (const unsigned char *c = (const unsigned char *)mods[i].name; *c; c++)
      h = cm_mix64(h ^ *c);
  }
  return n ? (h ? h : 1) : 0;
}
