/* tk-jinja-impl.h — internals of the Jinja engine shared by its lexer
 * (tk-jinja-lex.c), parser (tk-jinja-parse.c), values (tk-jinja-value.c)
 * and evaluator (tk-jinja-eval.c). Not a public header. */
#ifndef LMSERVE_TK_JINJA_IMPL_H
#define LMSERVE_TK_JINJA_IMPL_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cm-arena.h"
#include "tokenizer/tk-jinja.h"

/* ---- tokens ------------------------------------------------------------- */

enum tk_jk_tok {
  JK_TEXT,       /* literal template text: s, n */
  JK_EXPR_BEGIN, /* {{ */
  JK_EXPR_END,   /* }} */
  JK_STMT_BEGIN, /* {% */
  JK_STMT_END,   /* %} */
  JK_NAME,       /* identifier or keyword: s, n */
  JK_STRING,     /* decoded string literal: s, n */
  JK_INT,        /* i */
  JK_FLOAT,      /* f */
  JK_OP,         /* operator or punctuation: s, n (1-2 chars) */
  JK_EOF,
};

struct tk_jk_token {
  enum tk_jk_tok kind;
  const char *s; /* into the source or the template arena */
  size_t n;      /* bytes */
  int64_t i;
  double f;
  int line;
};

/* Splits src into tokens (applying whitespace control, trim_blocks and
 * lstrip_blocks); the token array lives in `arena`. */
int tk_jk_lex(const char *src, size_t len, struct cm_arena *arena, struct tk_jk_token **toks,
           size_t *n_toks, char *err, size_t errlen);

/* ---- syntax tree ---------------------------------------------------------- */

enum tk_jk_node_kind {
  /* statements */
  JN_BLOCK, JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_BREAK, JN_CONTINUE, JN_MACRO,
  /* expressions */
  JN_STR, JN_INT, JN_FLOAT, JN_BOOL, JN_NONE, JN_LIST, JN_DICT, JN_NAME, JN_ATTR, JN_INDEX,
  JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_NOT, JN_NEG, JN_POS, JN_BIN, JN_COND,
};

struct tk_jk_node {
  enum tk_jk_node_kind kind;
  int line;
  const char *s, *s2; /* names, strings, operators */
  size_t n, n2;       /* bytes */
  int64_t i;          /* int literal, bool, negated test */
  double f;
  struct tk_jk_node *a, *b, *c, *d; /* children by kind (see tk-jinja-parse.c) */
  struct tk_jk_node **items;        /* statements, arguments, list / dict elements */
  size_t n_items;
  const char **kw_names;         /* keyword arguments of calls / filters */
  size_t *kw_lens;
  struct tk_jk_node **kw_vals;
  size_t n_kw;
  int fn;                        /* resolved builtin for filters / tests / calls;
                                  * -1 on a call: a macro of the template */
};

struct tk_jinja {
  struct cm_arena arena; /* tokens and nodes */
  struct tk_jk_node *root;  /* JN_BLOCK */
};

/* Builtins, resolved at parse time (an unknown name is a parse error). */
enum tk_jk_filter {
  JF_TRIM, JF_LENGTH, JF_COUNT, JF_UPPER, JF_LOWER, JF_CAPITALIZE, JF_TITLE, JF_FIRST, JF_LAST,
  JF_JOIN, JF_DEFAULT, JF_D, JF_TOJSON, JF_STRING, JF_INT, JF_FLOAT, JF_LIST, JF_REPLACE,
  JF_SAFE, JF_REVERSE, JF_ABS, JF_ITEMS, JF_DICTSORT, JF_MAP, JF_SELECT, JF_REJECT,
  JF_SELECTATTR, JF_REJECTATTR, JF__N
};
enum tk_jk_test {
  JT_DEFINED, JT_UNDEFINED, JT_NONE, JT_STRING, JT_NUMBER, JT_INTEGER, JT_FLOAT, JT_BOOLEAN,
  JT_ITERABLE, JT_MAPPING, JT_SEQUENCE, JT_TRUE, JT_FALSE, JT_EVEN, JT_ODD, JT_DIVISIBLEBY,
  JT_EQ, JT_EQUALTO, JT_EQEQ, JT_NE, JT_NEQ, JT__N
};
enum tk_jk_method {
  JM_STRIP, JM_LSTRIP, JM_RSTRIP, JM_SPLIT, JM_STARTSWITH, JM_ENDSWITH, JM_UPPER, JM_LOWER,
  JM_TITLE, JM_CAPITALIZE, JM_REPLACE, JM_ITEMS, JM_KEYS, JM_VALUES, JM_GET, JM__N
};
enum tk_jk_global { JG_RAISE_EXCEPTION, JG_NAMESPACE, JG_RANGE, JG__N };

int tk_jk_filter_id(const char *s, size_t n);
int tk_jk_test_id(const char *s, size_t n);
int tk_jk_method_id(const char *s, size_t n);
int tk_jk_global_id(const char *s, size_t n);

/* ---- values ------------------------------------------------------------------ */

enum tk_jv_kind {
  JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC, JV_MACRO
};

struct tk_jv_list;
struct tk_jv_dict;

struct tk_jv {
  enum tk_jv_kind kind;
  union {
    int b;
    int64_t i;
    double f;
    struct {
      const char *s;
      size_t n; /* bytes */
    } str;
    struct tk_jv_list *list;
    struct tk_jv_dict *dict;
    int fn; /* JV_FUNC: a global id */
    const struct tk_jk_node *macro; /* JV_MACRO: its JN_MACRO node */
  } u;
};

struct tk_jv_list {
  struct tk_jv *items;
  size_t n, cap;
};

struct tk_jv_dict { /* insertion ordered, string keys */
  const char **keys;
  size_t *klens;
  struct tk_jv *vals;
  size_t n, cap;
  int is_namespace; /* attributes may be assigned */
};

struct tk_jv tk_jv_str(const char *s, size_t n);
struct tk_jv tk_jv_int(int64_t i);
struct tk_jv tk_jv_bool(int b);
struct tk_jv *tk_jv_dict_get(const struct tk_jv_dict *d, const char *k, size_t kn);
int tk_jv_dict_set(struct cm_arena *a, struct tk_jv_dict *d, const char *k, size_t kn, struct tk_jv v);
int tk_jv_list_push(struct cm_arena *a, struct tk_jv_list *l, struct tk_jv v);
int tk_jv_truthy(struct tk_jv v);
int tk_jv_equal(struct tk_jv a, struct tk_jv b);
/* Converts JSON to a value in the arena. */
int tk_jv_from_json(struct cm_arena *a, json_t *j, struct tk_jv *out, int depth);

/* A growable output string (malloc'd, capped). */
struct tk_jv_buf {
  char *p;
  size_t n, cap, max; /* bytes */
};
int tk_jv_buf_put(struct tk_jv_buf *b, const char *s, size_t n);
/* Appends v as Jinja prints it (Python str()). */
int tk_jv_print(struct tk_jv_buf *b, struct tk_jv v);
/* Appends v as Python repr() (strings quoted). */
int tk_jv_repr(struct tk_jv_buf *b, struct tk_jv v);
/* Appends v as JSON (json.dumps, ensure_ascii=False); indent < 0: one line. */
int tk_jv_tojson(struct tk_jv_buf *b, struct tk_jv v, int indent, int depth);

/* ---- evaluation (tk-jinja-eval.c, tk-jinja-builtins.c) ------------------------ */

struct tk_jk_frame {
  struct tk_jv_dict vars;
  struct tk_jk_frame *up;
};

struct tk_jk_ev {
  struct cm_arena *a;   /* every value of the render */
  struct tk_jv_buf *out;
  char *err;
  size_t errlen;
  struct tk_jk_frame *top; /* innermost scope */
  long iters;           /* loop iterations so far */
  int depth;
  int ctl;              /* 1: break, 2: continue pending */
  int macro_depth;      /* nested macro calls */
};

int tk_jk_eval(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out);
int tk_jk_err(struct tk_jk_ev *e, const struct tk_jk_node *n, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prints v into an arena string. */
int tk_jk_to_string(struct tk_jk_ev *e, struct tk_jv v, struct tk_jv *out);
/* The items a for loop visits (list items, dict keys, string characters). */
int tk_jk_iterate(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, struct tk_jv *list);
size_t tk_jk_cp_count(const char *s, size_t n);
size_t tk_jk_cp_offset(const char *s, size_t n, size_t k);
int tk_jk_filter(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, struct tk_jv *out);
int tk_jk_test(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv v, int *res);
/* A call of a macro of the template (n->fn < 0): its body rendered with the
 * arguments bound, in a scope that sees only the template's globals. */
int tk_jk_call_macro(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out);
/* A call of a global function or a method (n->kind == JN_CALL). */
int tk_jk_call(struct tk_jk_ev *e, const struct tk_jk_node *n, struct tk_jv *out);

#define JK_MAX_DEPTH 64             /* expression / statement nesting */
#define JK_MAX_OUTPUT (16u << 20)   /* bytes of rendered text */
#define JK_MAX_ARENA (256u << 20)   /* bytes of values per render */
#define JK_MAX_MACRO_DEPTH 16      /* nested macro calls */
#define JK_MAX_ITERS 1000000        /* loop iterations per render */

#endif
