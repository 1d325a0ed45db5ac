#ifndef MESHP2P_MP_H
#define MESHP2P_MP_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

// capture holds the hidden states copied out of the graph by cb_eval.
// It lives in C memory and is owned by exactly one shard's loop goroutine.
typedef struct {
	char   name[64];   // tensor to capture, "l_out-<last layer>"
	float *buf;        // cap floats
	size_t cap;
	size_t n;          // floats captured in this decode
	int    fired;      // how many times the tensor was seen in this decode
	int    err;        // 1: buffer too small, 2: tensor not contiguous, 3: not f32
} mp_capture;

bool mp_eval_cb(struct ggml_tensor *t, bool ask, void *ud);
void mp_set_capture(struct llama_context_params *p, mp_capture *c);
struct llama_model *mp_model_load(const char *path, struct llama_model_params p, uintptr_t handle);
void mp_log_init(int verbose);
struct ggml_threadpool *mp_threadpool_new(int n_threads, int poll);
long mp_timer_slack_ns(void);
void mp_batch_set(struct llama_batch *b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, int8_t out);
bool mp_batch_pos4(struct llama_batch *b, int n);
void mp_batch_spread_pos(struct llama_batch *b);
#endif
