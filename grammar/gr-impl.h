/* gr-impl.h — the grammar module's insides: the NFA builder every front end
 * (regex, choice, JSON, JSON Schema) emits into, the compiled grammar (one DFA
 * per rule, edges are byte classes or calls of other rules), and the limits.
 * Not for other modules: they use gr.h. */
#ifndef LMSERVE_GR_IMPL_H
#define LMSERVE_GR_IMPL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/gr.h"

/* ---- limits ------------------------------------------------------------- */
#define GR_MAX_NFA_STATES 400000u    /* per grammar */
#define GR_MAX_DFA_STATES 60000u     /* per grammar, all rules */
#define GR_MAX_DFA_CELLS  (8u << 20) /* states x byte classes */
#define GR_MAX_RULES      4096u
#define GR_MAX_REPEAT     10000u /* {n,m}: n and m at most this */
#define GR_MAX_DEPTH      128u   /* frames on one matcher stack (nesting) */
#define GR_MAX_STACKS     256u   /* stacks alive in one matcher state */
#define GR_MAX_SEEN       512u   /* stacks one step's closure may visit (left recursion) */
#define GR_RET_MEMO       8u     /* returns a matcher remembers (gr_returns) */
#define GR_RET_FRAMES     16u    /* frames of a return it remembers, at most */
#define GR_MAX_ALPHA      24u    /* ASCII alphabets per grammar (gr_grammar.alpha) */
#define GR_STEP_MEMO      32u    /* steps an alphabet mask remembers (gr-alpha.c) */
#define GR_TAIL_IDS       4096u  /* tokens a byte may be in to have a list (gr_vocab.tail_ids) */
#define GR_NONE           UINT32_MAX

/* ---- the NFA builder ---------------------------------------------------- */
enum { GR_E_EPS = 0, GR_E_BYTE = 1, GR_E_CALL = 2 };

struct gr_edge {
  uint32_t from, to;    /* NFA states of one rule */
  uint32_t callee;      /* GR_E_CALL: the rule called; `to` is where it returns */
  uint8_t kind, lo, hi; /* GR_E_BYTE: bytes lo..hi */
};

struct gr_nfa {
  struct gr_edge *e;
  size_t n_e, cap_e;
  uint32_t n_states;
  uint32_t *rule_start, *rule_final; /* (n_rules) NFA states */
  uint32_t n_rules, cap_rules;
  uint32_t tail_to, tail[4];          /* shared UTF-8 tails: k bytes 80..BF, then tail_to */
  uint32_t any_obj, any_arr, any_val; /* rules of any JSON object / array / value, or GR_NONE */
  int rc;                             /* sticky: the first error (0 while all is well) */
  char *err;                          /* where that error's text goes */
  size_t errlen;
};

void gr_nfa_init(struct gr_nfa *n, char *err, size_t errlen);
void gr_nfa_free(struct gr_nfa *n);
/* A new state (0 once the builder has failed: callers go on, the rc tells). */
uint32_t gr_nfa_state(struct gr_nfa *n);
/* A new rule with fresh start and final states; its id. */
uint32_t gr_nfa_rule(struct gr_nfa *n);
void gr_nfa_eps(struct gr_nfa *n, uint32_t from, uint32_t to);
void gr_nfa_byte(struct gr_nfa *n, uint32_t from, uint32_t to, uint8_t lo, uint8_t hi);
void gr_nfa_call(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t callee);
/* Code points lo..hi (no surrogates inside) as UTF-8 byte sequences from -> to. */
void gr_nfa_cps(struct gr_nfa *n, uint32_t from, uint32_t to, uint32_t lo, uint32_t hi);
/* The literal bytes s[len] from -> to. */
void gr_nfa_lit(struct gr_nfa *n, uint32_t from, uint32_t to, const char *s, size_t len);
/* Records the first error (later ones are dropped); returns it. */
int gr_nfa_fail(struct gr_nfa *n, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- code point sets (regex classes) ------------------------------------ */
struct gr_cpset {
  uint32_t *r; /* (n, 2): sorted, disjoint, non-adjacent [lo, hi] pairs */
  uint32_t n, cap;
  int oom; /* an allocation failed: the set is incomplete */
};
void gr_cpset_add(struct gr_cpset *s, uint32_t lo, uint32_t hi);
void gr_cpset_addset(struct gr_cpset *s, const struct gr_cpset *o);
void gr_cpset_normalize(struct gr_cpset *s); /* sort and merge */
void gr_cpset_negate(struct gr_cpset *s);    /* over U+0000..U+10FFFF without surrogates */
void gr_cpset_free(struct gr_cpset *s);
/* Emits s's code points from -> to (UTF-8, surrogates removed). */
void gr_nfa_cpset(struct gr_nfa *n, uint32_t from, uint32_t to, const struct gr_cpset *s);

/* ---- regex front end (gr-regex.c) ------------------------------------- */
/* Parses an ECMA-262 pattern and emits it from -> to. mode GR_RX_FULL: the
 * whole text (anchors are no-ops); GR_RX_SEARCH: JSON Schema's `pattern`
 * (unanchored ends may be surrounded by any text). json: the code points are
 * emitted as the contents of a JSON string (quote, backslash and control
 * characters escaped). Errors go to n (rc and err). */
enum { GR_RX_FULL = 0, GR_RX_SEARCH = 1 };
void gr_regex_emit(struct gr_nfa *n, const char *pat, size_t len, int mode, int json, uint32_t from,
                   uint32_t to, const char *what);

/* ---- JSON pieces (gr-json.c) ------------------------------------------- */
void gr_json_ws(struct gr_nfa *n, uint32_t from, uint32_t to);
/* The ':' between a key and its value, with whitespace around it (spaces and
 * tabs only). */
void gr_json_colon(struct gr_nfa *n, uint32_t from, uint32_t to);
/* One JSON-encoded code point of a string's contents (any escape). */
void gr_json_char(struct gr_nfa *n, uint32_t from, uint32_t to);
void gr_json_string(struct gr_nfa *n, uint32_t from, uint32_t to);
/* The DFA of a JSON string's contents after the opening quote (gr-json.c):
 * state 0 is a character boundary, 13 the closing quote; -1: refused. */
int gr_json_sx_step(int a, uint8_t b);
/* A JSON string that is none of names[count] (as JSON encodes them; another
 * spelling with escapes is not recognized). */
void gr_json_string_except(struct gr_nfa *n, uint32_t from, uint32_t to, const char *const *names,
                           size_t count);
void gr_json_number(struct gr_nfa *n, uint32_t from, uint32_t to);
void gr_json_integer(struct gr_nfa *n, uint32_t from, uint32_t to);
/* Emits the JSON encoding of string s[len] (quotes included). */
void gr_json_lit_string(struct gr_nfa *n, uint32_t from, uint32_t to, const char *s, size_t len);
/* The rule of any JSON value (made on first use, kept in *rule). */
uint32_t gr_json_value_rule(struct gr_nfa *n, uint32_t *rule);
int gr_json_object_build(struct gr_nfa *n);
int gr_choice_build(struct gr_nfa *n, const char *text, size_t len);
int gr_schema_build(struct gr_nfa *n, const char *text, size_t len);
int gr_ebnf_build(struct gr_nfa *n, const char *text, size_t len);

/* ---- the compiled grammar ----------------------------------------------- */
enum { GR_F_FINAL = 1, GR_F_CALLS = 2, GR_F_BYTES = 4 };

struct gr_call {
  uint32_t start; /* the callee rule's start DFA state */
  uint32_t ret;   /* the caller's DFA state after the callee returns */
};

struct gr_mask_cache; /* gr-mask.c */

struct gr_grammar {
  enum gr_kind kind;
  uint64_t hash;
  uint32_t n_states;  /* DFA states, all rules */
  uint32_t n_cls;     /* byte classes */
  uint8_t cls[256];   /* byte -> class */
  uint32_t *delta;    /* (n_states, n_cls): next DFA state or GR_NONE */
  uint8_t *flags;     /* (n_states): GR_F_* */
  uint32_t *call_off; /* (n_states + 1): state s's calls are calls[call_off[s]..call_off[s+1]) */
  struct gr_call *calls;
  uint32_t root;   /* the root rule's start DFA state */
  uint32_t n_root; /* the root rule's states are 0 .. n_root - 1 (only ever at a stack's bottom) */
  pthread_mutex_t lock; /* guards cache */
  struct gr_mask_cache *cache;
  /* reach[s]: how many plain characters (as in gr_vocab's u8ok) any text may
   * take from state s while staying in its rule without calls or returns (255:
   * any number); made on the first mask, under lock */
  uint8_t *reach;
  /* wall[s] (255: unknown): plain text from s is taken exactly when it has at
   * most wall[s] characters (a bounded string: maxLength) */
  uint8_t *wall;
  /* loop[s] (128 bits): the ASCII bytes that lead from s back to s, when s is
   * a state the walk's simple mode stays in (else empty) */
  uint64_t *loop; /* (n_states, 2) */
  /* term[s] (128 bits): the plain ASCII bytes left out of s's reach and wall
   * (they lead elsewhere: the quote that ends a run of [^']); a subtree with
   * one of them is walked */
  uint64_t *term; /* (n_states, 2) */
  /* takes[s] (192 bits): the ASCII bytes s takes, and bit 128 when it takes a byte
   * >= 0x80 (made with reach) */
  uint64_t *takes; /* (n_states, 3) */
  /* Runs of an ASCII alphabet: alpha[k] (128 bits) are the alphabets (common ones
   * and those the grammar's states take), and run[s * n_alpha + k] how many
   * characters of alpha[k] any text may take from s by the rule's own byte
   * edges (255: any number): a bounded run ([a-z]{3,8}) or a loop. Made with
   * reach. */
  uint32_t n_alpha;
  uint64_t *alpha;  /* (n_alpha, 2) */
  uint8_t *run;     /* (n_states, n_alpha) */
  uint8_t *run_any; /* (n_states): the longest of s's runs (0: none) */
  uint64_t *run_set; /* (n_states, 2): the union of the alphabets s has a run of */
  /* per alphabet, the vocabulary's tokens made of its bytes (gr-alpha.c), made on
   * first use; guarded by lock */
  struct gr_alpha_cache *alpha_cache;
};

/* Turns a finished NFA (rule 0 is the root) into g's DFAs. */
int gr_determinize(struct gr_nfa *n, struct gr_grammar *g);

/* ---- matchers ----------------------------------------------------------- */
/* A set of stacks: stack i's frames are frames[off[i] .. off[i+1]), bottom
 * first; every frame is a DFA state (below the top: where to return). */
struct gr_stackset {
  uint32_t n;       /* stacks */
  uint32_t *off;    /* (cap_n + 1) */
  uint32_t *frames; /* (cap_f) */
  uint64_t *hash;   /* (cap_n): each stack's hash, for de-duplication */
  uint32_t cap_n, cap_f;
};

/* One level of a mask walk (a depth in the vocabulary trie): while the walk
 * has not called or returned, only the top state changes (simple); else the
 * whole set is in set. */
struct gr_level {
  int simple;
  uint32_t top;
  /* simple: the one stack the path is on is *base (a level's set, or the
   * matcher's) with its top frame replaced by top */
  const struct gr_stackset *base;
  uint32_t pc; /* characters begun on the path so far */
  int pq;      /* the plain-text UTF-8 decoder's state after the path; -1: not plain */
  int pt;      /* the path holds a byte of the walk's first state's term */
  /* a table of the children of the path's node that the walk follows (kt > 0: its
   * number): the next entry kpos; the subtree of the child being walked ends at
   * cend, the node's at pend; kprev: the level of the next table out (-1: none) */
  uint32_t kt, kpos, cend, pend;
  int kprev;
  struct gr_stackset set;
  struct gr_stackset one; /* one stack of set, walked alone below the node */
  /* an alphabet mask (gr-alpha.c): the ASCII bytes outside the alphabet that the
   * tops of the set after this many bytes of the alphabet take (128 bits) */
  uint64_t out[2];
};

struct gr_matcher {
  const struct gr_grammar *g;
  struct gr_stackset cur;        /* the state */
  struct gr_stackset next, alt;  /* scratch for accept_bytes */
  struct gr_stackset todo, walk; /* scratch for closures and mask walks */
  struct gr_level *levels;       /* (n_levels) mask walk levels */
  uint32_t n_levels;
  uint64_t *seen; /* closure seeds already expanded (hashes) */
  uint32_t n_seen, cap_seen;
  int truncated; /* some stacks were dropped at GR_MAX_STACKS */
  /* gr_returns' last answers: the closed sets of stacks f[len] (a caller's
   * frames, its top the state to return to), replaced in turn */
  struct gr_ret {
    uint64_t h;
    uint32_t len;
    uint32_t f[GR_RET_FRAMES];
    struct gr_stackset set;
  } ret[GR_RET_MEMO];
  uint32_t ret_next;
  /* an alphabet mask's steps that call or return, from a level's set (or the
   * matcher's) with a top over a byte (key: level << 40 | top << 8 | byte),
   * remembered while that mask is made */
  struct gr_amemo {
    uint64_t key;
    struct gr_stackset set;
  } amemo[GR_STEP_MEMO];
  uint32_t n_amemo;
  uint64_t n_alpha_masks; /* masks made by gr_alpha_mask (tests) */
};

/* The closed set of stacks after a step over byte b from `in` (which is
 * closed); 0 when empty. */
int gr_step(struct gr_matcher *m, const struct gr_stackset *in, uint8_t b, struct gr_stackset *out);
/* The bytes m's state can take next: ok[b] = 1; their count (tests, forced). */
int gr_matcher_next_bytes(const struct gr_matcher *m, uint8_t *ok);
uint64_t gr_stackset_hash(const struct gr_stackset *s);
void gr_stackset_free(struct gr_stackset *s);
int gr_stackset_copy(struct gr_stackset *d, const struct gr_stackset *s);
/* The closed set of stacks after a rule returns into the caller's frames f[len]
 * (f[len - 1]: the state to return to), remembered for the next calls; NULL when
 * out of memory. Valid until the matcher's next gr_returns. */
const struct gr_stackset *gr_returns(struct gr_matcher *m, const uint32_t *f, uint32_t len);
/* Stack j of s as the only one of d. */
int gr_stackset_one(struct gr_stackset *d, const struct gr_stackset *s, uint32_t j);
/* 1 when the bytes b[0..n) may follow the closed set `from` (steps of one stack
 * are table look-ups until it calls or returns), 0 when not, or an error; only
 * the matcher's scratch sets change. */
int gr_follows(struct gr_matcher *m, const struct gr_stackset *from, const uint8_t *b, size_t n);

/* ---- alphabet masks (gr-alpha.c) ---------------------------------------- */
/* m's mask into bits (zeroed) without a walk of the trie, where m's state takes
 * a run of one of the grammar's alphabets: 1 when made, 0 when the state is not
 * one for it (bits untouched), or an error. */
int gr_alpha_mask(struct gr_matcher *m, const struct gr_vocab *v, uint32_t *bits);
void gr_alpha_cache_free(struct gr_alpha_cache *c);
/* Each token holding an ASCII byte of b (128 bits), not in bits yet, that m's
 * state allows, into bits: 1; 0 when a byte of b is in too many tokens to have a
 * list (nothing done); or an error. */
int gr_alpha_listed(struct gr_matcher *m, const struct gr_vocab *v, const uint64_t *b,
                    uint32_t *bits);

/* ---- vocabularies ------------------------------------------------------- */
/* A node of the vocabulary trie: everything a mask walk reads about it in 32
 * bytes, so that a walk that skips from subtree to subtree touches one cache
 * line per node it visits (eight arrays cost a miss each). */
struct gr_node {
  /* asc (128 bits: lo, hi): the ASCII bytes in the subtree (its own byte
   * included) */
  uint64_t asc[2];
  uint32_t end;   /* the subtree ends before this node */
  uint32_t tok;   /* the tokens spelled exactly by the path: ids[tok .. next node's tok) */
  uint16_t depth; /* 1 .. max_len */
  uint8_t byte;   /* reached over this byte from the parent (at depth - 1) */
  /* u8ok bit q: every byte string of the subtree, read from this node's byte on
   * with the UTF-8 decoder in state q (0: at a character boundary), is
   * well-formed plain JSON string text (no '"', '\\', control characters;
   * possibly ending inside a character) */
  uint8_t u8ok;
  uint8_t nchars; /* the most characters such a string starts (255 cap) */
  uint8_t wide;   /* the subtree has a byte >= 0x80 */
  uint16_t kids;  /* 1 + its children's table (gr_vocab.kid_at), 0: none */
};

/* A trie of the token byte strings, in preorder: node[0 .. n_nodes), and a
 * sentinel node[n_nodes] whose tok is n_ids. */
struct gr_vocab {
  int32_t n;       /* tokens */
  uint8_t **bytes; /* (n): each token's bytes, pointers into blob */
  uint8_t *blob;
  uint32_t *lens; /* (n): bytes */
  uint32_t n_nodes;
  struct gr_node *node; /* (n_nodes + 1) */
  /* (n_nodes): the first of node i and its later siblings whose subtree is not
   * all plain text from a character boundary (u8ok bit 0 clear), else the end
   * of i's parent: a walk that has the plain tokens in already jumps there */
  uint32_t *mixed;
  int32_t *ids; /* (n_ids): the tokens with bytes, sorted by them */
  int32_t n_ids;
  uint32_t max_len; /* bytes of the longest token */
  uint64_t serial;  /* tells vocabularies apart in caches */
  uint8_t *tchars;  /* (n): characters of each token, when it is plain text (255 cap) */
  /* (max_len + 1, words): bitmap w holds the tokens that are plain text from a
   * character boundary and have at most w characters; NULL for vocabularies
   * with tokens longer than 64 bytes */
  uint32_t *plain_le;
  /* has[b] (b < 128, when plain_le is made): the tokens holding ASCII byte b, a
   * bitmap of the vocabulary each; has[128]: those holding a byte >= 0x80 */
  uint32_t *has; /* (129, words) */
  /* ids[first_at[b] .. first_at[b + 1]): the tokens whose first byte is b */
  uint32_t first_at[257];
  /* (when plain_le is made) the tokens holding ASCII byte b (b < 128), or a byte
   * >= 0x80 (b = 128), after their first byte: tail_n[b] of them, and for the bytes
   * with at most GR_TAIL_IDS their ids, ascending, in tail_ids[tail_at[b] ..
   * tail_at[b + 1]) (an empty list for the others) */
  uint32_t tail_n[129];
  uint32_t tail_at[130];
  int32_t *tail_ids;
  /* (when plain_le is made) the tokens that are not plain text from a character
   * boundary, plain_le's complement, as a trie of their own (the same ids; a few
   * thousand tokens of a vocabulary, a trie small enough for the core's caches):
   * a walk that has the plain tokens in already walks only these */
  struct gr_vocab *rest;
  /* Tables of the children of the nodes with many (and of the root: kids_root),
   * so that a walk from a simple state passes over the children whose byte the
   * state refuses without reading their nodes, which lie far apart: table k is
   * kid_byte / kid_node [kid_at[k - 1], kid_at[k]) (1-based, as gr_node.kids) */
  uint32_t *kid_at, *kid_node;
  uint8_t *kid_byte;
  uint16_t kids_root;
};

void gr_mask_cache_free(struct gr_mask_cache *c);
/* Fills g->reach (gr-plain.c). */
int gr_plain_reach(struct gr_grammar *g);
/* Frees what gr_plain_reach made (reach, wall, loop, term, the runs). */
void gr_plain_free(struct gr_grammar *g);
/* The plain-text UTF-8 decoder (gr-plain.c): the state after byte b, or -1. */
int gr_u8_step(int q, uint8_t b);
/* Fills the nodes' u8ok, nchars, asc and wide, and v->tchars, v->plain_le,
 * v->has (gr-plain.c). */
int gr_plain_vocab(struct gr_vocab *v);

#endif
