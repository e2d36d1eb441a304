/* md-lora-list.h — the adapters a server runs with: --lora-modules NAME=PATH (vLLM's
 * flag), parsed the same way by every role, and a sum over the list that lets the
 * roles check they agree (a request names its adapter by number on the wire). */
#ifndef LMSERVE_MD_LORA_LIST_H
#define LMSERVE_MD_LORA_LIST_H
#include <stddef.h>
#include <stdint.h>

#define MD_LORA_NAME_MAX 128

#define MD_LORA_MODULES_HELP                                                                       \
  "serve LoRA adapter PATH (a PEFT folder, or llama.cpp's GGUF adapter file) as "                 \
  "model NAME: a request naming NAME runs with it; repeated or comma-separated, in the same "      \
  "order on every role"

/* vLLM's --max-lora-rank (serve, worker) */
#define MD_MAX_LORA_RANK_HELP                                                                      \
  "refuse adapters whose rank is above N, as vLLM does (default: any rank up to 512)"
/* vLLM's --enable-lora (serve): taken, and needed for nothing */
#define MD_ENABLE_LORA_HELP                                                                        \
  "vLLM's switch for adapters, accepted: adapters are served whenever --lora-modules names one"

#define MD_RUNTIME_LORA_HELP                                                                       \
  "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, which load and unload "           \
  "adapters while serving (vLLM's; also when VLLM_ALLOW_RUNTIME_LORA_UPDATING is 1 or true). "     \
  "Anyone who can reach the API can then have the workers read any path they can"

struct md_lora_module {
  char name[MD_LORA_NAME_MAX];
  char path[4096];
};

/* NAME=PATH into *out: 0, or CM_ERR_INVAL with a one-line reason in err (an empty
 * or overlong name or path, a name with a character outside [A-Za-z0-9._:/@+-], no path). */
int md_lora_module_parse(const char *arg, struct md_lora_module *out, char *err, size_t errlen);
/* Every entry of a --lora-modules flag (CM_OPT_STRS: at most CM_STRS_MAX) into
 * out[CM_STRS_MAX]: their number, or CM_ERR_INVAL with a reason in err (a bad entry,
 * a name given twice). */
struct cm_strs;
int md_lora_modules(const struct cm_strs *args, struct md_lora_module *out, char *err,
                    size_t errlen);
/* The list's sum over its names in order; 0 for an empty list. */
uint64_t md_lora_list_sum(const struct md_lora_module *mods, int n);

#endif
