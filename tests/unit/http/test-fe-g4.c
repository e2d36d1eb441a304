/* test-fe-g4.c — Gemma 4's thinking channel and native tool calls split out of
 * generated text (frontend/fe-g4.c): each text is fed whole, then split at
 * every byte boundary (and at every pair of boundaries), and must give the same
 * content, reasoning and calls, with no piece of a marker in the content or
 * the reasoning of any delta. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm-err.h"
#include "frontend/fe-g4.h"
#include "tests/harness/th.h"

struct result {
  char content[1024], reasoning[1024], calls[2048];
  char streamed[2048]; /* FE_G4_STREAM_CALLS: the deltas as "|name|arguments" per call */
  size_t n_calls;
  int leak; /* a delta held a piece of a marker */
};

/* 1 when s[0..n) holds "<|" or "|>" (every marker has one). */
static int has_marker_piece(const char *s, size_t n) {
  for (size_t i = 0; i + 1 < n; i++)
    if ((s[i] == '<' && s[i + 1] == '|') || (s[i] == '|' && s[i + 1] == '>')) return 1;
  return 0;
}

static void take(struct result *r, struct fe_g4_out *o) {
  if (has_marker_piece(o->content.data ? o->content.data : "", o->content.len) ||
      has_marker_piece(o->reasoning.data ? o->reasoning.data : "", o->reasoning.len))
    r->leak = 1;
  strncat(r->content, o->content.data ? o->content.data : "",
          sizeof(r->content) - strlen(r->content) - 1);
  strncat(r->reasoning, o->reasoning.data ? o->reasoning.data : "",
          sizeof(r->reasoning) - strlen(r->reasoning) - 1);
  if (o->n_calls) {
    if (r->n_calls) strncat(r->calls, ",", sizeof(r->calls) - strlen(r->calls) - 1);
    strncat(r->calls, o->calls.data, sizeof(r->calls) - strlen(r->calls) - 1);
  }
  r->n_calls += o->n_calls;
  if (o->n_deltas) {
    char *t = malloc(o->deltas.len + 3);
    TH_REQUIRE(t);
    snprintf(t, o->deltas.len + 3, "[%s]", o->deltas.data);
    json_t *ds = json_loads(t, 0, NULL);
    TH_CHECK(json_array_size(ds) == o->n_deltas);
    size_t i;
    json_t *d;
    json_array_foreach(ds, i, d) {
      const char *name = json_string_value(json_object_get(d, "name"));
      const char *args = json_string_value(json_object_get(d, "arguments"));
      size_t at = strlen(r->streamed);
      snprintf(r->streamed + at, sizeof(r->streamed) - at, "%s%s%s", name ? "|" : "",
               name   ? name
               : args ? args
                      : "?",
               name ? "|" : "");
    }
    json_decref(ds);
    free(t);
  }
  fe_g4_out_reset(o);
}

/* The calls of r->calls as streamed deltas join them: "|name|arguments" each. */
static void calls_as_streamed(const struct result *r, char *out, size_t cap) {
  char t[2100];
  snprintf(t, sizeof t, "[%s]", r->calls);
  json_t *cs = json_loads(t, 0, NULL);
  size_t i, at = 0;
  json_t *c;
  out[0] = 0;
  json_array_foreach(cs, i, c) {
    at += (size_t)snprintf(out + at, cap - at, "|%s|%s",
                           json_string_value(json_object_get(c, "name")),
                           json_string_value(json_object_get(c, "arguments")));
    if (at >= cap) break;
  }
  json_decref(cs);
}

/* Feeds text in pieces cut at cuts[0..n_cuts) (ascending). */
static void run(const char *text, unsigned flags, const size_t *cuts, int n_cuts,
                struct result *r) {
  memset(r, 0, sizeof(*r));
  struct fe_g4_split s;
  struct fe_g4_out o;
  fe_g4_split_init(&s, flags);
  fe_g4_out_init(&o);
  size_t at = 0, n = strlen(text);
  for (int i = 0; i <= n_cuts; i++) {
    size_t to = i < n_cuts ? cuts[i] : n;
    TH_CHECK(fe_g4_split_push(&s, text + at, to - at, &o) == 0);
    take(r, &o);
    at = to;
  }
  TH_CHECK(fe_g4_split_flush(&s, &o) == 0);
  take(r, &o);
  fe_g4_out_free(&o);
  fe_g4_split_free(&s);
}

static int same(const struct result *a, const struct result *b) {
  return !strcmp(a->content, b->content) && !strcmp(a->reasoning, b->reasoning) &&
         !strcmp(a->calls, b->calls) && a->n_calls == b->n_calls;
}

/* The text whole gives (content, reasoning, calls); so does every split. */
static void check_splits(const char *text, unsigned flags, const char *content,
                         const char *reasoning, const char *calls, int pairs) {
  struct result whole, part;
  run(text, flags, NULL, 0, &whole);
  TH_CHECK_EQ_STR(whole.content, content);
  TH_CHECK_EQ_STR(whole.reasoning, reasoning);
  TH_CHECK_EQ_STR(whole.calls, calls);
  /* texts whose answer holds marker-like text (kept as text) skip the leak check */
  int strict = !has_marker_piece(content, strlen(content)) &&
               !has_marker_piece(reasoning, strlen(reasoning));
  TH_CHECK(!strict || !whole.leak);
  size_t n = strlen(text);
  int bad = 0;
  /* streamed: the deltas give each call's name, then its arguments in pieces, which
   * join to the calls' arguments (a cut call: what was read of it) */
  struct result stream;
  run(text, flags | FE_G4_STREAM_CALLS, NULL, 0, &stream);
  char want_streamed[2048];
  calls_as_streamed(&whole, want_streamed, sizeof want_streamed);
  if (!strstr(whole.content, "<|tool_call>")) TH_CHECK_EQ_STR(stream.streamed, want_streamed);
  for (size_t i = 1; i < n && (flags & FE_G4_TOOLS) && !bad; i++) {
    size_t cut[1] = {i};
    run(text, flags | FE_G4_STREAM_CALLS, cut, 1, &part);
    if (!same(&stream, &part) || strcmp(part.streamed, stream.streamed)) {
      th_fail(__FILE__, __LINE__, "streamed, split at %zu: calls %s, deltas %s (want %s)", i,
              part.calls, part.streamed, stream.streamed);
      bad = 1;
    }
  }
  for (size_t i = 1; i < n && !bad; i++) {
    size_t cut[1] = {i};
    run(text, flags, cut, 1, &part);
    if (!same(&whole, &part) || (strict && part.leak)) {
      th_fail(__FILE__, __LINE__, "split at %zu: content \"%s\" reasoning \"%s\" calls %s%s", i,
              part.content, part.reasoning, part.calls,
              strict && part.leak ? " (a marker leaked)" : "");
      bad = 1;
    }
    for (size_t j = i + 1; pairs && j < n && !bad; j++) {
      size_t cuts[2] = {i, j};
      run(text, flags, cuts, 2, &part);
      if (!same(&whole, &part) || (strict && part.leak)) {
        th_fail(__FILE__, __LINE__, "split at %zu and %zu: content \"%s\" reasoning \"%s\"", i, j,
                part.content, part.reasoning);
        bad = 1;
      }
    }
  }
  /* one byte at a time */
  size_t *all = malloc(n * sizeof(*all));
  TH_REQUIRE(all);
  for (size_t i = 0; i + 1 < n; i++)
    all[i] = i + 1;
  run(text, flags, all, n ? (int)n - 1 : 0, &part);
  free(all);
  TH_CHECK(same(&whole, &part) && !(strict && part.leak));
}

TH_TEST(g4_reasoning_then_answer) {
  check_splits("<|channel>thought\nLet me think.<channel|>The answer is 4.", FE_G4_REASONING,
               "The answer is 4.", "Let me think.", "", 1);
}

TH_TEST(g4_reasoning_without_label) {
  check_splits("<|channel>thousand reasons<channel|>Done", FE_G4_REASONING, "Done",
               "thousand reasons", "", 1);
  check_splits("<|channel>thou<channel|>x", FE_G4_REASONING, "x", "thou", "", 1);
}

TH_TEST(g4_reasoning_off_keeps_text) {
  /* without the flag the markers are text like any other */
  struct result r;
  run("<|channel>thought\nx<channel|>y", 0, NULL, 0, &r);
  TH_CHECK_EQ_STR(r.content, "<|channel>thought\nx<channel|>y");
}

TH_TEST(g4_cut_inside_thought) {
  /* max_tokens ends the text inside the thought: it stays reasoning */
  check_splits("<|channel>thought\nstill thinking <|cha", FE_G4_REASONING, "",
               "still thinking <|cha", "", 1);
}

TH_TEST(g4_text_that_looks_like_a_marker) {
  check_splits("a <|b> and <tool and <| done", FE_G4_REASONING | FE_G4_TOOLS,
               "a <|b> and <tool and <| done", "", "", 1);
}

TH_TEST(g4_one_call) {
  check_splits("Let me look.<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3}"
               "<tool_call|>",
               FE_G4_REASONING | FE_G4_TOOLS, "Let me look.", "",
               "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris, "
               "FR\\\",\\\"days\\\":3}\"}",
               1);
}

TH_TEST(g4_parallel_calls_after_thought) {
  const char *t = "<|channel>thought\nTwo cities.<channel|><|tool_call>call:w{city:<|\"|>Oslo"
                  "<|\"|>}<tool_call|><|tool_call>call:w{city:<|\"|>Rome<|\"|>,units:<|\"|>c"
                  "<|\"|>}<tool_call|>";
  struct result r;
  run(t, FE_G4_REASONING | FE_G4_TOOLS, NULL, 0, &r);
  TH_CHECK_EQ_INT(r.n_calls, 2);
  TH_CHECK_EQ_STR(r.reasoning, "Two cities.");
  TH_CHECK_EQ_STR(r.content, "");
  check_splits(t, FE_G4_REASONING | FE_G4_TOOLS, "", "Two cities.", r.calls, 0);
}

TH_TEST(g4_nested_values) {
  char *name = NULL, *args = NULL;
  const char *c = "call:f{a:{b:[1,2.5,-3e2],c:true},d:null,e:<|\"|>x}y,z<|\"|>,f:[],g:{}}";
  TH_REQUIRE(fe_g4_parse_call(c, strlen(c), &name, &args) == 0);
  TH_CHECK_EQ_STR(name, "f");
  json_t *j = json_loads(args, 0, NULL);
  json_t *want = json_loads("{\"a\":{\"b\":[1,2.5,-300.0],\"c\":true},\"d\":null,\"e\":\"x}y,z\","
                            "\"f\":[],\"g\":{}}",
                            0, NULL);
  TH_CHECK(j && want && json_equal(j, want));
  json_decref(j);
  json_decref(want);
  free(name);
  free(args);
}

TH_TEST(g4_bad_calls) {
  static const char *const bad[] = {
      "",           "call:",         "call:{a:1}",           "get_weather{a:1}",
      "call:f",     "call:f{a:1",    "call:f{a:<|\"|>open}", "call:f{a:1}trailing",
      "call:f{:1}", "call:f{a:[1,}",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char *name = NULL, *args = NULL;
    if (fe_g4_parse_call(bad[i], strlen(bad[i]), &name, &args) != CM_ERR_PARSE)
      th_fail(__FILE__, __LINE__, "'%s' parsed as a call", bad[i]);
    free(name);
    free(args);
  }
  /* a call that is not one comes back as content, markers and all */
  check_splits("x<|tool_call>call:{}<tool_call|>y", FE_G4_TOOLS,
               "x<|tool_call>call:{}<tool_call|>y", "", "", 1);
}

TH_TEST(g4_call_cut_by_length) {
  check_splits("ok<|tool_call>call:f{a:<|\"|>unfinish", FE_G4_TOOLS,
               "ok<|tool_call>call:f{a:<|\"|>unfinish", "", "", 1);
  /* streamed, what was read of it went out as a call, not as content */
  struct result r;
  run("ok<|tool_call>call:f{a:<|\"|>unfin", FE_G4_TOOLS | FE_G4_STREAM_CALLS, NULL, 0, &r);
  TH_CHECK_EQ_STR(r.content, "ok");
  TH_CHECK_EQ_STR(r.streamed, "|f|{\"a\":\"unfin");
}

TH_TEST(g4_streamed_arguments_grow_as_written) {
  /* fed a byte at a time: the name once, then fragments that only ever extend */
  const char *t = "<|tool_call>call:get_weather{city:<|\"|>Zürich<|\"|>,days:12,f:[true,None],"
                  "u:{x:-1.5e3}}<tool_call|>";
  struct fe_g4_split s;
  struct fe_g4_out o;
  fe_g4_split_init(&s, FE_G4_TOOLS | FE_G4_STREAM_CALLS);
  fe_g4_out_init(&o);
  size_t n = strlen(t), pieces = 0;
  char joined[512] = "";
  for (size_t i = 0; i < n; i++) {
    TH_REQUIRE(fe_g4_split_push(&s, t + i, 1, &o) == 0);
    if (o.n_deltas) {
      char buf[600];
      snprintf(buf, sizeof buf, "[%s]", o.deltas.data);
      json_t *ds = json_loads(buf, 0, NULL);
      size_t k;
      json_t *d;
      json_array_foreach(ds, k, d) {
        const char *a = json_string_value(json_object_get(d, "arguments"));
        if (a)
          strncat(joined, a, sizeof joined - strlen(joined) - 1), pieces++;
        else
          TH_CHECK_EQ_STR(json_string_value(json_object_get(d, "name")), "get_weather");
      }
      json_decref(ds);
    }
    fe_g4_out_reset(&o);
  }
  TH_CHECK(fe_g4_split_flush(&s, &o) == 0);
  TH_CHECK_EQ_STR(joined,
                  "{\"city\":\"Zürich\",\"days\":12,\"f\":[true,null],\"u\":{\"x\":-1.5e3}}");
  TH_CHECK(pieces > 10);
  fe_g4_out_free(&o);
  fe_g4_split_free(&s);
}

TH_TEST(g4_calls_ignored_without_tools) {
  struct result r;
  run("<|channel>thought\nx<channel|><|tool_call>call:f{}<tool_call|>", FE_G4_REASONING, NULL, 0,
      &r);
  TH_CHECK_EQ_STR(r.reasoning, "x");
  TH_CHECK_EQ_STR(r.content, "<|tool_call>call:f{}<tool_call|>");
  TH_CHECK_EQ_INT(r.n_calls, 0);
}
