/* test-kn-registry.c — the backend registry: lookup by name, the errors for
 * an unknown or unusable name, the automatic choice (over the real table and
 * over tables of stand-in entries whose probes the test decides), and the
 * capability queries on entries and on a backend made through one. */
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "kernels/cuda/kn-cuda.h"
#include "kernels/kn-backend-impl.h"
#include "kernels/kn-registry.h"
#include "lmserve-config.h"
#include "tests/harness/th.h"

TH_TEST(registry_lookup_by_name) {
  int n = kn_backend_reg_count();
  TH_REQUIRE(n >= 2);
  TH_CHECK(kn_backend_reg_at(-1) == NULL);
  TH_CHECK(kn_backend_reg_at(n) == NULL);
  for (int i = 0; i < n; i++) {
    const struct kn_backend_reg *r = kn_backend_reg_at(i);
    TH_REQUIRE(r);
    TH_CHECK(kn_backend_reg_find(kn_backend_reg_name(r)) == r); /* names are unique */
    TH_CHECK(strlen(kn_backend_reg_summary(r)) > 0);
  }
  const struct kn_backend_reg *cpu = kn_backend_reg_find("cpu");
  TH_REQUIRE(cpu);
  TH_CHECK_EQ_STR(kn_backend_reg_name(cpu), "cpu");
  /* "cuda" is known in every build, runnable or not */
  TH_REQUIRE(kn_backend_reg_find("cuda"));
  TH_CHECK(kn_backend_reg_find("CPU") == NULL); /* exact names */
  TH_CHECK(kn_backend_reg_find("cpu-avx2") == NULL);
  TH_CHECK(kn_backend_reg_find("") == NULL);
  TH_CHECK(kn_backend_reg_find(NULL) == NULL);

  const struct kn_backend_reg *r = NULL;
  char err[256];
  TH_CHECK_EQ_INT(kn_backend_choose("cpu", &r, err, sizeof(err)), 0);
  TH_CHECK(r == cpu);
  TH_CHECK_EQ_INT(kn_backend_reg_probe(cpu, err, sizeof(err)), 0);
}

TH_TEST(registry_unknown_name_lists_the_names) {
  const struct kn_backend_reg *r = (const void *)1;
  char err[256] = "";
  TH_CHECK_EQ_INT(kn_backend_choose("tpu", &r, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(r == NULL);
  TH_CHECK(strstr(err, "'tpu'") != NULL);
  TH_CHECK(strstr(err, "cpu") != NULL);
  TH_CHECK(strstr(err, "cuda") != NULL);
  TH_CHECK(strstr(err, "auto") != NULL);

  struct kn_backend *be = (void *)1;
  TH_CHECK_EQ_INT(kn_backend_open("cpuu", NULL, &be, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(be == NULL);

  /* a name that comes from the environment says so */
  TH_REQUIRE(setenv("LMSERVE_DEVICE", "bogus", 1) == 0);
  TH_CHECK_EQ_INT(kn_backend_choose(NULL, &r, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "LMSERVE_DEVICE") != NULL && strstr(err, "'bogus'") != NULL);
  /* an explicit name wins over the environment */
  TH_CHECK_EQ_INT(kn_backend_choose("cpu", &r, err, sizeof(err)), 0);
  TH_REQUIRE(setenv("LMSERVE_DEVICE", "cpu", 1) == 0);
  TH_CHECK_EQ_INT(kn_backend_choose(NULL, &r, err, sizeof(err)), 0);
  TH_CHECK(r == kn_backend_reg_find("cpu"));
}

TH_TEST(registry_unusable_name_says_why) {
  const struct kn_backend_reg *cuda = kn_backend_reg_find("cuda");
  TH_REQUIRE(cuda);
  char why[256] = "";
  if (kn_backend_reg_probe(cuda, why, sizeof(why)) == 0)
    TH_SKIP("a CUDA device is visible: the unusable-name path needs a machine without one");
  TH_CHECK(strlen(why) > 0);
  const struct kn_backend_reg *r = NULL;
  char err[512] = "";
  TH_CHECK_EQ_INT(kn_backend_choose("cuda", &r, err, sizeof(err)), CM_ERR_UNSUPPORTED);
  TH_CHECK(r == NULL);
  TH_CHECK(strstr(err, why) != NULL);                /* the probe's reason */
  TH_CHECK(strstr(err, "usable here: cpu") != NULL); /* and what would work */
}

/* The real table: without a visible GPU (or without CUDA in the build) the
 * automatic choice is the CPU; with one it is CUDA. */
TH_TEST(registry_auto_without_gpu_picks_cpu) {
  const struct kn_backend_reg *cuda = kn_backend_reg_find("cuda");
  const struct kn_backend_reg *cpu = kn_backend_reg_find("cpu");
  TH_REQUIRE(cuda && cpu);
  int gpu = kn_backend_reg_probe(cuda, NULL, 0) == 0;
  const struct kn_backend_reg *r = NULL;
  char err[256];
  TH_CHECK_EQ_INT(kn_backend_choose("auto", &r, err, sizeof(err)), 0);
  TH_CHECK(r == (gpu ? cuda : cpu));
  TH_CHECK_EQ_INT(kn_backend_choose("", &r, err, sizeof(err)), 0);
  TH_CHECK(r == (gpu ? cuda : cpu));
  TH_REQUIRE(unsetenv("LMSERVE_DEVICE") == 0);
  TH_CHECK_EQ_INT(kn_backend_choose(NULL, &r, err, sizeof(err)), 0);
  TH_CHECK(r == (gpu ? cuda : cpu));
  TH_REQUIRE(setenv("LMSERVE_DEVICE", "auto", 1) == 0);
  TH_CHECK_EQ_INT(kn_backend_choose(NULL, &r, err, sizeof(err)), 0);
  TH_CHECK(r == (gpu ? cuda : cpu));
  TH_REQUIRE(setenv("LMSERVE_DEVICE", "cpu", 1) == 0);
}

/* ---- stand-in entries: the choice logic with probes the test controls ------ */

static int g_gpu_visible;

static int fake_gpu_probe(char *why, size_t whylen) {
  return g_gpu_visible ? 0 : cm_fail(why, whylen, CM_ERR_UNSUPPORTED, "no fake device");
}

static int fake_host_probe(char *why, size_t whylen) {
  (void)why;
  (void)whylen;
  return 0;
}

static int fake_broken_probe(char *why, size_t whylen) {
  (void)why;
  (void)whylen;
  return CM_ERR_DEVICE; /* no reason given: the registry supplies one */
}

static const struct kn_backend_reg fake_gpu = {.name = "fgpu",
                                               .summary = "stand-in device",
                                               .priority = 100,
                                               .caps = KN_CAP_SAMPLE,
                                               .probe = fake_gpu_probe};
static const struct kn_backend_reg fake_host = {.name = "fhost",
                                                .summary = "stand-in host",
                                                .priority = 10,
                                                .caps = KN_CAP_HOST_MEMORY | KN_CAP_SAMPLE,
                                                .probe = fake_host_probe};
static const struct kn_backend_reg fake_broken = {.name = "fbroken",
                                                  .summary = "never usable",
                                                  .priority = 1000,
                                                  .caps = 0,
                                                  .probe = fake_broken_probe};

TH_TEST(registry_auto_choice_by_priority) {
  const struct kn_backend_reg *fwd[] = {&fake_gpu, &fake_host, &fake_broken};
  const struct kn_backend_reg *rev[] = {&fake_broken, &fake_host, &fake_gpu};
  const struct kn_backend_reg *r;
  char err[512];
  for (int order = 0; order < 2; order++) {
    const struct kn_backend_reg *const *t = order ? rev : fwd;
    g_gpu_visible = 0;
    TH_CHECK_EQ_INT(kn_backend_choose_from(t, 3, NULL, &r, err, sizeof(err)), 0);
    TH_CHECK(r == &fake_host); /* no device: the host entry */
    g_gpu_visible = 1;
    TH_CHECK_EQ_INT(kn_backend_choose_from(t, 3, "auto", &r, err, sizeof(err)), 0);
    TH_CHECK(r == &fake_gpu); /* a device: the higher priority */
    /* a name bypasses priority; an unusable one says why and what is usable */
    TH_CHECK_EQ_INT(kn_backend_choose_from(t, 3, "fhost", &r, err, sizeof(err)), 0);
    TH_CHECK(r == &fake_host);
    g_gpu_visible = 0;
    TH_CHECK_EQ_INT(kn_backend_choose_from(t, 3, "fgpu", &r, err, sizeof(err)), CM_ERR_UNSUPPORTED);
    TH_CHECK(strstr(err, "no fake device") && strstr(err, "usable here: fhost"));
    TH_CHECK_EQ_INT(kn_backend_choose_from(t, 3, "fbroken", &r, err, sizeof(err)), CM_ERR_DEVICE);
    TH_CHECK(strstr(err, cm_strerror(CM_ERR_DEVICE)) != NULL);
  }
  /* nothing usable at all */
  const struct kn_backend_reg *none[] = {&fake_gpu, &fake_broken};
  r = (const void *)1;
  TH_CHECK_EQ_INT(kn_backend_choose_from(none, 2, "auto", &r, err, sizeof(err)),
                  CM_ERR_UNSUPPORTED);
  TH_CHECK(r == NULL);
  TH_CHECK(strstr(err, "fgpu: no fake device") != NULL);
  TH_CHECK_EQ_INT(kn_backend_choose_from(none, 0, "auto", &r, err, sizeof(err)),
                  CM_ERR_UNSUPPORTED);
  /* an unknown name lists the table it was looked up in */
  TH_CHECK_EQ_INT(kn_backend_choose_from(fwd, 3, "cpu", &r, err, sizeof(err)), CM_ERR_NOENT);
  TH_CHECK(strstr(err, "fgpu, fhost, fbroken") != NULL);
  /* a tiny message buffer truncates, never overflows */
  char small[8];
  TH_CHECK_EQ_INT(kn_backend_choose_from(fwd, 3, "nope", &r, small, sizeof(small)), CM_ERR_NOENT);
  TH_CHECK_EQ_INT(strlen(small), sizeof(small) - 1);
}

/* ---- capabilities ---------------------------------------------------------------- */

TH_TEST(registry_capabilities) {
  const struct kn_backend_reg *cpu = kn_backend_reg_find("cpu");
  const struct kn_backend_reg *cuda = kn_backend_reg_find("cuda");
  TH_REQUIRE(cpu && cuda);
  unsigned c = kn_backend_reg_caps(cpu);
  TH_CHECK(c & KN_CAP_HOST_MEMORY);
  TH_CHECK(c & KN_CAP_SAMPLE);
  TH_CHECK(c & KN_CAP_ALLREDUCE); /* shared-memory collectives */
  unsigned g = kn_backend_reg_caps(cuda);
  TH_CHECK(!(g & KN_CAP_HOST_MEMORY));
  TH_CHECK(g & KN_CAP_SAMPLE);
  TH_CHECK(!(g & KN_CAP_ALLREDUCE) == !LMSERVE_HAVE_NCCL); /* collectives over NCCL */
  TH_CHECK_EQ_INT(kn_backend_reg_caps(NULL), 0);

  /* a backend made through the entry has the entry's capabilities */
  struct kn_backend *be = NULL;
  char err[256];
  struct kn_backend_opts o = {.n_threads = 1, .local_rank = 3};
  TH_REQUIRE(kn_backend_open("cpu", &o, &be, err, sizeof(err)) == 0 && be);
  TH_CHECK_EQ_INT(kn_backend_caps(be), c);
  TH_CHECK(kn_backend_has(be, KN_CAP_HOST_MEMORY));
  TH_CHECK(kn_backend_has(be, KN_CAP_HOST_MEMORY | KN_CAP_SAMPLE));
  TH_CHECK(kn_backend_has(be, KN_CAP_ALLREDUCE));
  TH_CHECK(kn_backend_has(be, KN_CAP_SAMPLE | KN_CAP_ALLREDUCE));
  TH_CHECK(!kn_backend_has(be, KN_CAP_SAMPLE | (1u << 30)));
  TH_CHECK(kn_backend_has(be, 0));
  /* host memory: no device to report on */
  size_t fb, tb;
  TH_CHECK_EQ_INT(kn_mem_info(be, &fb, &tb), CM_ERR_UNSUPPORTED);
  /* the name is still there for logs */
  TH_CHECK(strncmp(kn_backend_name(be), "cpu-", 4) == 0);
  kn_backend_destroy(be);

  TH_CHECK_EQ_INT(kn_backend_caps(NULL), 0);
  TH_CHECK(!kn_backend_has(NULL, 0));
  TH_CHECK(!kn_backend_has(NULL, KN_CAP_SAMPLE));

  /* defaults when o is NULL; a negative local rank is refused */
  TH_REQUIRE(kn_backend_reg_create(cpu, NULL, &be, err, sizeof(err)) == 0 && be);
  kn_backend_destroy(be);
  o.local_rank = -1;
  be = (void *)1;
  TH_CHECK_EQ_INT(kn_backend_reg_create(cpu, &o, &be, err, sizeof(err)), CM_ERR_INVAL);
  TH_CHECK(be == NULL);
}

TH_TEST(registry_device_for_local_rank) {
  TH_CHECK_EQ_INT(kn_cuda_device_for_rank(0, 1), 0);
  TH_CHECK_EQ_INT(kn_cuda_device_for_rank(5, 1), 0);
  TH_CHECK_EQ_INT(kn_cuda_device_for_rank(3, 8), 3);
  TH_CHECK_EQ_INT(kn_cuda_device_for_rank(9, 8), 1);
  TH_CHECK_EQ_INT(kn_cuda_device_for_rank(5, 4), 1);
}
