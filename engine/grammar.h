#ifndef MESHP2P_GRAMMAR_H
#define MESHP2P_GRAMMAR_H
#include <stddef.h>
#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// A compiled GBNF grammar over a model's vocabulary (llama.cpp's grammar
// engine, llama-grammar.cpp of the pinned module), driven without
// llama_sampler so that no C++ exception and no abort can escape: every
// token is checked before it is accepted.
typedef struct mp_grammar mp_grammar;

// MP_GRAMMAR_MAX_CLASS bounds the elements of one character class
// (engine.MaxGrammarClass).
#define MP_GRAMMAR_MAX_CLASS 256

// MP_GRAMMAR_MAX_STACKS bounds the live parse stacks
// (engine.MaxGrammarStacks): a grammar one point of which can be followed
// by more is refused when it is compiled.
#define MP_GRAMMAR_MAX_STACKS 128

// mp_grammar_new compiles src (root rule "root"); NULL with err filled on
// failure (parse error, undefined rule, left recursion).
mp_grammar *mp_grammar_new(const struct llama_vocab *vocab, const char *src, char *err, size_t errlen);
void mp_grammar_free(mp_grammar *g);
// mp_grammar_stacks is the number of parse stacks alive: the grammar's
// cost per candidate token is proportional to it.
size_t mp_grammar_stacks(const mp_grammar *g);
// mp_grammar_stack_elems is the total length of the live stacks: a
// candidate's cost is roughly proportional to it.
size_t mp_grammar_stack_elems(const mp_grammar *g);
// mp_grammar_class_work is the character-class elements at the top of the
// live stacks, summed: one candidate code point is matched against each,
// so an apply costs about the candidates times it.
size_t mp_grammar_class_work(const mp_grammar *g);
// mp_grammar_apply sets the logit of every candidate the grammar forbids
// to -INFINITY (end-of-generation tokens only where the grammar may end).
// 0 ok, -1 an internal error (err filled).
int mp_grammar_apply(mp_grammar *g, llama_token_data_array *cur, char *err, size_t errlen);
// mp_grammar_accept advances the grammar past tok: 0 ok, 1 tok is not
// allowed here (nothing changed), -1 an internal error (err filled).
int mp_grammar_accept(mp_grammar *g, llama_token tok, char *err, size_t errlen);

// mp_schema_to_grammar converts a JSON schema to GBNF with llama.cpp's
// json-schema-to-grammar (common/, pinned module). Returns a malloc'd
// grammar, or NULL with err filled (the converter names what it cannot
// handle).
char *mp_schema_to_grammar(const char *schema, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
