/* tk-jinja.h — a small Jinja template engine for chat templates.
 *
 * Supported (what the Gemma 3 / Gemma 4 chat templates and the usual
 * Hugging Face chat templates use), with trim_blocks and lstrip_blocks on,
 * as Hugging Face's apply_chat_template compiles them:
 *   syntax      {{ expr }}, {% stmt %}, {# comment #}, whitespace control
 *               with '-' on either side ({%- -%}, {{- -}}, {#- -#})
 *   statements  if / elif / else / endif; for x in e [if cond] / else /
 *               endfor, with tuple targets (for k, v in d.items()); break,
 *               continue; set x = e, set ns.attr = e, set x %}..{% endset;
 *               macro m(a, b=default) / endmacro, called as m(x, b=y) (the
 *               body sees its arguments and the template's globals; no
 *               caller / varargs); generation / endgeneration (no-ops)
 *   expressions literals (strings, ints, floats, true/false/none and their
 *               Python spellings, lists, dicts), names, a.b, a[b], slices
 *               a[i:j:k], calls, unary not / - / +, binary or and == != < <=
 *               > >= in, not in, + - * / // % ~, a if c else b, filters
 *               (e | f(args)) and tests (e is [not] t(args))
 *   filters     trim, length/count, upper, lower, capitalize, title, first,
 *               last, join, default/d, tojson (indent=), string, int, float,
 *               list, replace, safe, reverse, abs, items, dictsort (keys),
 *               map('filter', ...) / map(attribute='a', default=x),
 *               select / reject('test', ...), selectattr / rejectattr('a',
 *               'test', ...) (filter and test names must be literals)
 *   tests       defined, undefined, none, string, number, integer, float,
 *               boolean, iterable, mapping, sequence, true, false, even, odd,
 *               divisibleby, eq/equalto/==, ne/!=
 *   methods     str: strip lstrip rstrip split startswith endswith upper
 *               lower title capitalize replace format-free; dict: items
 *               keys values get; list: (none besides indexing)
 *   globals     raise_exception(msg), namespace(k=v, ...), range(...)
 *   loop        loop.index, index0, revindex, revindex0, first, last, length,
 *               previtem, nextitem
 * Anything else (include, import, extends, block, call, filter blocks,
 * unknown filters / tests / methods / functions, unknown statements) is
 * refused when the template is loaded, with the line number. Undefined names print as "" and are false;
 * an attribute or item of an undefined value is a render error.
 *
 * Rendering allocates only from the call's arena (capped) and caps output
 * and loop iterations, so a hostile template or request cannot exhaust
 * memory. */
#ifndef LMSERVE_TK_JINJA_H
#define LMSERVE_TK_JINJA_H
#include <jansson.h>
#include <stddef.h>

struct tk_jinja;

/* Parses a template. On error returns a negative cm_err and a message with
 * the line number in errbuf. */
int tk_jinja_parse(const char *src, size_t len, struct tk_jinja **out, char *errbuf,
                   size_t errlen);
void tk_jinja_free(struct tk_jinja *t);

/* Renders with the variables of `vars` (a JSON object: strings, numbers,
 * booleans, null, arrays, objects). *out is malloc'd and NUL terminated;
 * the caller frees it. Errors (raise_exception, type errors, limits):
 * negative cm_err and the message in errbuf. */
int tk_jinja_render(const struct tk_jinja *t, json_t *vars, char **out, size_t *out_len,
                    char *errbuf, size_t errlen);

#endif
