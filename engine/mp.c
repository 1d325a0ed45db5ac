// C helpers for the engine: kept in C so no Go callback runs per graph node.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mp.h"
#ifdef __linux__
#include <sys/prctl.h>
#endif

// Timer slack (issue 16): Linux lets a sleeping thread's timer fire up to
// its slack late (50 µs by default) so wake-ups coalesce. Go's sysmon
// sleeps 20 µs at a time while the process is busy; each wake-up can
// preempt one of ggml's worker threads spinning at a barrier, which then
// holds up every other worker of that graph. A constructor runs before the
// Go runtime starts its threads, and every thread inherits the slack of its
// creator, so this covers sysmon, the Go Ps and ggml's workers alike.
// MESHP2P_TIMER_SLACK_NS overrides it (50000: the kernel default; 0: leave
// it alone).
static long mp_slack_ns = 0;

__attribute__((constructor)) static void mp_set_timer_slack(void) {
#ifdef __linux__
	long ns = 1000000;
	const char *e = getenv("MESHP2P_TIMER_SLACK_NS");
	if (e != NULL && *e != 0) {
		char *end = NULL;
		long v = strtol(e, &end, 10);
		if (end != NULL && *end == 0 && v >= 0 && v <= 100000000) {
			ns = v;
		}
	}
	if (ns > 0 && prctl(PR_SET_TIMERSLACK, (unsigned long)ns, 0, 0, 0) == 0) {
		mp_slack_ns = ns;
	}
#endif
}

long mp_timer_slack_ns(void) {
#ifdef __linux__
	int v = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	return v < 0 ? -1 : (long)v;
#else
	return -1;
#endif
}

// mp_threadpool_new is a persistent ggml worker pool: without one ggml
// creates and joins n_threads-1 threads on every graph compute (each
// llama_decode). poll is ggml's spin level before a worker sleeps between
// graphs (0: sleep at once, which leaves idle CPU to the other shards of a
// machine).
struct ggml_threadpool *mp_threadpool_new(int n_threads, int poll) {
	struct ggml_threadpool_params p = ggml_threadpool_params_default(n_threads);
	p.poll = (uint32_t)poll;
	return ggml_threadpool_new(&p);
}


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

// A model load reports to Go (loadprogress.go) instead of printing dots,
// and Go may abort it (a cancelled context).
// mpGoLoadProgress is Go's (loadprogress.go): the load's progress, false to
// abort it. ud carries a cgo.Handle.
extern _Bool mpGoLoadProgress(float progress, uintptr_t handle);

static bool mp_progress(float progress, void *ud) { return mpGoLoadProgress(progress, (uintptr_t)ud); }

// mp_model_load loads path with p, reporting to the Go callback behind
// handle. The handle goes into the params only here, on the C side: a
// cgo.Handle is a small integer, and a Go-side llama_model_params holding
// it in its void * field is a Go stack slot with an invalid pointer, which
// the garbage collector's stack scan aborts on ("invalid pointer found on
// stack") when it runs while that frame is live.
struct llama_model *mp_model_load(const char *path, struct llama_model_params p, uintptr_t handle) {
	p.progress_callback = mp_progress;
	p.progress_callback_user_data = (void *)handle;
	return llama_model_load_from_file(path, p);
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

// mp_batch_pos4 gives b room for 4 positions per row (n rows): llama.cpp
// reads 4 per row from a batch of embeddings when the model ropes with
// M-RoPE (llama_batch_allocr::ubatch_add: pos[j*n_tokens + i], j < 4).
// llama_batch_free frees it as llama_batch_init's. Returns false when out
// of memory (b unchanged).
bool mp_batch_pos4(struct llama_batch *b, int n) {
	llama_pos *p = (llama_pos *)malloc(sizeof(llama_pos) * 4 * (size_t)n);
	if (p == NULL) {
		return false;
	}
	free(b->pos);
	b->pos = p;
	return true;
}

// mp_batch_spread_pos fills the 4 positions of each of b's n_tokens rows
// from the first: (p, p, p, 0), as llama.cpp fills a text batch's for
// M-RoPE (llm_graph_input_pos::set_input).
void mp_batch_spread_pos(struct llama_batch *b) {
	int n = b->n_tokens;
	for (int i = 0; i < n; i++) {
		b->pos[n + i] = b->pos[i];
		b->pos[2 * n + i] = b->pos[i];
		b->pos[3 * n + i] = 0;
	}
}
