// C helpers for the engine: kept in C so no Go callback runs per graph node.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mp.h"


bool mp_eval_cb(struct ggml_tensor *t, bool ask, void *ud) {
	mp_capture *c = (mp_capture *)ud;
	if (strcmp(t->name, c->name) != 0) {
		return ask ? false : true;
	}
	if (ask) {
		return true;
	}
	c->fired++;
	if (!ggml_is_contiguous(t)) { c->err = 2; return false; }
	if (t->type != GGML_TYPE_F32) { c->err = 3; return false; }
	size_t ne = (size_t)ggml_nelements(t);
	if (c->n + ne > c->cap) { c->err = 1; return false; }
	ggml_backend_tensor_get(t, c->buf + c->n, 0, ne * sizeof(float));
	c->n += ne;
	// Returning false stops the current graph split: on CPU that skips the
	// final norm and the lm_head, which a non-tail shard never needs.
	return false;
}

void mp_set_capture(struct llama_context_params *p, mp_capture *c) {
	p->cb_eval = mp_eval_cb;
	p->cb_eval_user_data = c;
}

static bool mp_no_progress(float progress, void *ud) { (void)progress; (void)ud; return true; }

void mp_quiet_model_params(struct llama_model_params *p) {
	p->progress_callback = mp_no_progress;
	p->progress_callback_user_data = NULL;
}

static int mp_log_level = GGML_LOG_LEVEL_ERROR;

static void mp_log(enum ggml_log_level level, const char *text, void *ud) {
	(void)ud;
	if (level == GGML_LOG_LEVEL_CONT) {
		return;
	}
	if ((int)level >= mp_log_level) {
		fputs(text, stderr);
	}
}

void mp_log_init(int verbose) {
	mp_log_level = verbose ? GGML_LOG_LEVEL_DEBUG : GGML_LOG_LEVEL_ERROR;
	llama_log_set(mp_log, NULL);
}

void mp_batch_set(struct llama_batch *b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, int8_t out) {
	if (b->token) b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = out;
}
