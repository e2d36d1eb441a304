/* test-chat.c — chat templates and the Jinja engine: the real Gemma 3
 * template and the Gemma 4 / features fixtures against renderings made by
 * an independent implementation (tests/fixtures/tokenizer/chat-expected.json
 * from tests/reference/tokenizer/chat-ref.js, @huggingface/jinja), byte for
 * byte, errors included; parse-time refusals; render-time limits. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm-err.h"
#include "tokenizer/tk-chat.h"
#include "tokenizer/tk-jinja.h"
#include "tokenizer/tk-tokenizer.h"
#include "tests/harness/th.h"
#include "tt-util.h"

TH_TEST(chat_matches_reference) {
  json_t *cases = json_load_file(tt_fixture("chat-cases.json"), 0, NULL);
  json_t *expected = json_load_file(tt_fixture("chat-expected.json"), 0, NULL);
  TH_REQUIRE(json_is_array(cases) && json_is_object(expected));
  TH_CHECK(json_array_size(cases) >= 13);
  tt_chat_compare(cases, expected);
  json_decref(cases);
  json_decref(expected);
}

TH_TEST(chat_gemma3_prompt_tokens) {
  const struct tk_tokenizer *tok = tt_gemma();
  struct tk_chat *c = NULL;
  char err[256], *out = NULL;
  size_t len;
  TH_REQUIRE(tk_chat_load(tt_gemma_dir(), &c, err, sizeof err) == 0);
  json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"Hi\"}]", 0, NULL);
  TH_REQUIRE(tk_chat_render(c, msgs, 1, NULL, &out, &len, err, sizeof err) == 0);
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  /* the template writes <bos> itself: encode without the post-processor */
  TH_REQUIRE(tk_encode(tok, NULL, out, len, TK_MATCH_SPECIAL, &ids, &n, &cap) == 0);
  TH_CHECK(n >= 6 && ids[0] == 2 && ids[1] == 105 && ids[n - 3] == 105);
  free(out);
  /* bad messages are client errors */
  json_t *bad = json_loads("[{\"content\": \"no role\"}]", 0, NULL);
  TH_CHECK_EQ_INT(tk_chat_render(c, bad, 1, NULL, &out, &len, err, sizeof err), CM_ERR_INVAL);
  json_decref(bad);
  bad = json_loads("{\"role\": \"user\"}", 0, NULL);
  TH_CHECK_EQ_INT(tk_chat_render(c, bad, 1, NULL, &out, &len, err, sizeof err), CM_ERR_INVAL);
  json_decref(bad);
  bad = json_loads("[{\"role\": \"user\", \"content\": 5}]", 0, NULL);
  TH_CHECK_EQ_INT(tk_chat_render(c, bad, 1, NULL, &out, &len, err, sizeof err), CM_ERR_INVAL);
  json_decref(bad);
  free(ids);
  json_decref(msgs);
  tk_chat_free(c);
}

TH_TEST(jinja_parse_refusals) {
  static const struct {
    const char *src, *msg;
  } cases[] = {
      {"{% call m() %}x{% endcall %}", "unsupported statement 'call'"},
      {"{{ x | map('nosuchfilter') }}", "unsupported filter 'nosuchfilter'"},
      {"{{ x | selectattr('a', 'nosuchtest') }}", "unsupported test 'nosuchtest'"},
      {"{{ x | select(t) }}", "must be a string literal"},
      {"{% macro m() %}x{% endmacro %}{{ n() }}", "unknown function 'n'"},
      {"{% macro m(a, 1) %}{% endmacro %}", "expected a parameter name"},
      {"a\n{% include 'x' %}", "line 2: unsupported statement 'include'"},
      {"{{ x | wordwrap }}", "unsupported filter 'wordwrap'"},
      {"{{ x is sameas y }}", "unsupported test 'sameas'"},
      {"{{ strftime_now('%Y') }}", "unknown function 'strftime_now'"},
      {"{{ x.format(1) }}", "unsupported method 'format'"},
      {"{% if x %}no end", "missing"},
      {"{{ x ", "unterminated tag"},
      {"{{ 'abc }}", "unterminated string"},
      {"{# open comment", "unterminated comment"},
      {"{% break %}", "outside a loop"},
      {"{% for a, b, c in x %}{% endfor %}", "expected 'in'"},
      {"{{ x @ y }}", "unexpected character"},
      {"{% set a, b = 1, 2 %}", "tuple assignment"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tk_jinja *t = NULL;
    char err[256] = "";
    int rc = tk_jinja_parse(cases[i].src, strlen(cases[i].src), &t, err, sizeof err);
    if (rc != CM_ERR_PARSE || !strstr(err, cases[i].msg))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d \"%s\" (want \"%s\")", i, rc, err,
              cases[i].msg);
    tk_jinja_free(t);
  }
  /* deep nesting is refused, not a stack overflow */
  char deep[4096];
  size_t n = 0;
  n += (size_t)snprintf(deep, sizeof deep, "{{ ");
  for (int i = 0; i < 1000; i++) deep[n++] = '(';
  deep[n] = 0;
  struct tk_jinja *t = NULL;
  char err[256];
  TH_CHECK_EQ_INT(tk_jinja_parse(deep, n, &t, err, sizeof err), CM_ERR_PARSE);
}

static int render(const char *src, const char *vars, char **out, char *err, size_t errlen) {
  struct tk_jinja *t = NULL;
  int rc = tk_jinja_parse(src, strlen(src), &t, err, errlen);
  if (rc) return rc;
  json_t *v = json_loads(vars, 0, NULL);
  size_t len;
  rc = tk_jinja_render(t, v, out, &len, err, errlen);
  json_decref(v);
  tk_jinja_free(t);
  return rc;
}

TH_TEST(jinja_render_semantics) {
  static const struct {
    const char *src, *vars, *want;
  } cases[] = {
      {"{{ x }}|{{ y }}|{{ z }}|{{ f }}", "{\"x\": true, \"y\": [1, \"a\"], \"z\": null, \"f\": 0.1}",
       "True|[1, 'a']|None|0.1"},
      {"{{ missing }}{{ missing is defined }}{{ (missing or 'dflt') }}", "{}", "Falsedflt"},
      {"{% for x in [] %}a{% else %}empty{% endfor %}", "{}", "empty"},
      {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "{}", "1"},
      {"  {% if true %}\n  yes\n  {% endif %}\nend", "{}", "  yes\nend"},
      {"a {{- ' b ' -}} c", "{}", "a b c"},
      {"{{ 'x' ~ 1 ~ none }}", "{}", "x1None"},
      {"{{ '日本語'[1] }}{{ '日本語' | length }}{{ '日本語'[::-1] }}", "{}", "本3語本日"},
      {"{{ ' a  b '.split() | tojson }}{{ 'a,b,,c'.split(',') | tojson }}", "{}",
       "[\"a\", \"b\"][\"a\", \"b\", \"\", \"c\"]"},
      {"{{ s | trim }}", "{\"s\": \"\\u3000 x \\n\"}", "x"},
      {"{{ 1.0 }} {{ 2.5e-7 }} {{ 10 / 4 }}", "{}", "1.0 2.5e-07 2.5"},
      {"{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", "{\"d\": {\"b\": 2, \"a\": 1}}",
       "a1b2"},
      {"{{ \"it's\" }} {{ ['it\\'s'] }}", "{}", "it's [\"it's\"]"},
      {"{{ [' a ', 'b '] | map('trim') | join('|') }} {{ [1, 2, 3, 4] | select('even') | list }}"
       " {{ [0, 1, '', 'x'] | reject | list }} {{ [{'a': 1}, {}] | map(attribute='a', default=0)"
       " | list }} {{ [{'a': 1}, {'a': 2}] | rejectattr('a', 'odd') | list }}", "{}",
       "a|b [2, 4] [0, ''] [1, 0] [{'a': 2}]"},
      {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
       "{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet(name='c') }}", "{}",
       "Hi a! Hi b? Hi c!"},
      {"{% set g = 'G' %}{% macro m() %}{{ g }}{{ l is defined }}{% endmacro %}"
       "{% for l in [5] %}{{ m() }}{% endfor %}", "{}", "GFalse"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL, err[256] = "";
    int rc = render(cases[i].src, cases[i].vars, &out, err, sizeof err);
    if (rc || strcmp(out, cases[i].want))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d %s: got \"%s\" want \"%s\"", i, rc, err,
              out ? out : "", cases[i].want);
    free(out);
  }
}

TH_TEST(jinja_render_errors_and_limits) {
  static const struct {
    const char *src, *msg;
    int code;
  } cases[] = {
      {"{{ raise_exception('custom failure') }}", "custom failure", CM_ERR_INVAL},
      {"{{ nothing.attr }}", "undefined value", CM_ERR_INVAL},
      {"{{ 1 + 'a' }}", "unsupported operand", CM_ERR_INVAL},
      {"{{ 1 // 0 }}", "division by zero", CM_ERR_INVAL},
      {"{% set x = range(100000) %}{% for i in x %}{% for j in x %}{% endfor %}{% endfor %}",
       "too many loop iterations", CM_ERR_TOOBIG},
      {"{% for i in range(100) %}{% set x = range(1000000) %}{% endfor %}", "memory limit",
       CM_ERR_NOMEM},
      {"{% for i in range(1000000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
       "output larger", CM_ERR_TOOBIG},
      {"{% for x in none %}{% endfor %}", "none", CM_ERR_INVAL},
      {"{% set n.a = 1 %}", "not a namespace", CM_ERR_INVAL},
      {"{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}", "macros nested deeper",
       CM_ERR_DEPTH},
      {"{{ later() }}{% macro later() %}x{% endmacro %}", "not defined as a macro", CM_ERR_INVAL},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "takes 1 arguments", CM_ERR_INVAL},
      {"{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", "no parameter 'b'", CM_ERR_INVAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL, err[256] = "";
    int rc = render(cases[i].src, "{}", &out, err, sizeof err);
    if (rc != cases[i].code || !strstr(err, cases[i].msg))
      th_fail(__FILE__, __LINE__, "case %zu: rc %d \"%s\" (want %d \"%s\")", i, rc, err,
              cases[i].code, cases[i].msg);
    TH_CHECK(out == NULL);
  }
}

TH_TEST(chat_load_forms) {
  /* a model directory: chat_template.jinja wins over tokenizer_config.json,
   * AddedToken objects give their content */
  struct tk_chat *c = NULL;
  char err[256], *out = NULL;
  size_t len;
  TH_REQUIRE(tk_chat_load(tt_fixture("gemma4-dir"), &c, err, sizeof err) == 0);
  json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"Be brief.\"},"
                            " {\"role\": \"user\", \"content\": \"Hi\"}]", 0, NULL);
  TH_REQUIRE(tk_chat_render(c, msgs, 1, NULL, &out, &len, err, sizeof err) == 0);
  TH_CHECK_EQ_STR(out, "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
  free(out);
  tk_chat_free(c);
  /* a list of named templates: "default" is used */
  TH_REQUIRE(tk_chat_load(tt_fixture("list-template/tokenizer_config.json"), &c, err, sizeof err) == 0);
  TH_REQUIRE(tk_chat_render(c, msgs, 0, NULL, &out, &len, err, sizeof err) == 0);
  TH_CHECK_EQ_STR(out, "<s>[system] Be brief.\n[user] Hi\n");
  free(out);
  /* extra variables reach the template */
  tk_chat_free(c);
  TH_REQUIRE(tk_chat_from_string("{{ tools | length }}", 20, NULL, &c, err, sizeof err) == 0);
  json_t *extra = json_loads("{\"tools\": [{\"name\": \"f\"}, {\"name\": \"g\"}]}", 0, NULL);
  TH_REQUIRE(tk_chat_render(c, msgs, 0, extra, &out, &len, err, sizeof err) == 0);
  TH_CHECK_EQ_STR(out, "2");
  free(out);
  tk_chat_free(c);
  json_decref(extra);
  json_decref(msgs);
  /* no template at all, or a broken one: refused at load */
  TH_CHECK_EQ_INT(tk_chat_load(tt_fixture("tiny"), &c, err, sizeof err), CM_ERR_NOENT);
  TH_CHECK_EQ_INT(tk_chat_load(tt_fixture("tiny/tokenizer.json"), &c, err, sizeof err),
                  CM_ERR_NOENT); /* valid JSON, but no chat_template */
  TH_CHECK_EQ_INT(tk_chat_from_string("{% bad %}", 9, NULL, &c, err, sizeof err), CM_ERR_PARSE);
  TH_CHECK(strstr(err, "unsupported statement 'bad'") != NULL);
}
