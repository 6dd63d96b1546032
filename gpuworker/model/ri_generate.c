/*
 * ri generate: run the model runtime on a prompt and stream the reply.
 *
 *   ri generate --prompt "Why is the sky blue?" --chat [--attn retroinfer]
 *               [--max-tokens N] [--model NAME|PATH] [--dump-kv DIR]
 *
 * Prints the generated text as it comes (stdout), a progress bar during long
 * prefills when stdout is a terminal, and prefill / decode tokens per second
 * at the end (stderr).  Settings also come from --config FILE and RI_GEN_*.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_config.h"
#include "common/cm_runtime.h"
#include "common/cm_log.h"
#include "common/cm_status.h"
#include "common/cm_thread.h"
#include "gpuworker/model/mdl_gen.h"
#include "gpuworker/model/mdl_kvdump.h"
#include "gpuworker/model/mdl_model.h"
#include "gpuworker/model/mdl_quant.h"
#include "gpuworker/model/mdl_sample.h"

static CM_ALLOC_TAG(gen_tag, "generate");

typedef struct gen_cfg {
    char *model;        /* GGUF path; empty = the default model */
    char *prompt;       /* prompt text */
    char *prompt_file;  /* or a file holding it */
    bool chat;          /* wrap in the chat template */
    char *system;       /* chat system prompt; empty = the model's */
    char *attn;         /* attention backend */
    int64_t max_tokens; /* tokens to generate */
    double temperature; /* 0 = greedy */
    int64_t retrieval_min; /* retroinfer's retrieval floor, tokens */
    double adapt_tau;   /* retroinfer's per-head cut (0 = off) */
    double top_p;       /* nucleus */
    int64_t seed;       /* sampling seed */
    cm_runtime_t rt;     /* threads, log level, kernels, model dir and knobs (cm_runtime.h) */
    int64_t ctx;        /* sequence capacity; 0 = prompt + max-tokens */
    int64_t chunk;      /* prefill chunk */
    int64_t budget;     /* exact-token budget of quest/streaming/oracle; 0 = auto */
    int64_t update_tokens; /* retroinfer: tokens per index update (and the indexing threshold) */
    char *dump_kv;      /* directory for the KV capture */
    bool stream;        /* print tokens as they come */
    bool stats;         /* print the speed summary */
    char *act;          /* decode activations: i16, i8, f32 */
} gen_cfg_t;

#define GEN_ITEM(n, t, d, h, f) {n, t, d, h, offsetof(gen_cfg_t, f), 0, 0, NULL}
static const cm_config_item_t gen_items[] = {
    GEN_ITEM("model", CM_CFG_STRING, NULL, "model name (smollm2-135m, gemma3-270m) or GGUF file (default: smollm2-135m)", model),
    GEN_ITEM("prompt", CM_CFG_STRING, NULL, "prompt text", prompt),
    GEN_ITEM("prompt-file", CM_CFG_STRING, NULL, "read the prompt from this file", prompt_file),
    GEN_ITEM("chat", CM_CFG_BOOL, "false", "apply the model's chat template", chat),
    GEN_ITEM("system", CM_CFG_STRING, NULL, "system prompt for --chat", system),
    GEN_ITEM("attn", CM_CFG_STRING, "full", "attention backend: full, retroinfer, quest, streaming, oracle", attn),
    {"max-tokens", CM_CFG_INT, "128", "tokens to generate", offsetof(gen_cfg_t, max_tokens), 0, 1 << 20, NULL},
    {"temperature", CM_CFG_DOUBLE, "0", "sampling temperature (0 = greedy)", offsetof(gen_cfg_t, temperature), 0,
     100, NULL},
    {"top-p", CM_CFG_DOUBLE, "1", "nucleus sampling mass", offsetof(gen_cfg_t, top_p), 0.001, 1, NULL},
    GEN_ITEM("seed", CM_CFG_INT, "1", "sampling seed", seed),
    CM_RUNTIME_LOG_ITEM(gen_cfg_t, rt),
    CM_RUNTIME_COMPUTE_ITEMS(gen_cfg_t, rt),
    {"ctx", CM_CFG_INT, "0", "sequence capacity in tokens (0 = prompt + max-tokens)", offsetof(gen_cfg_t, ctx), 0,
     1 << 22, NULL},
    {"chunk", CM_CFG_INT, "64", "prefill chunk in tokens", offsetof(gen_cfg_t, chunk), 1, 4096, NULL},
    {"budget", CM_CFG_INT, "0", "exact-token budget for quest/streaming/oracle (0 = auto)",
     offsetof(gen_cfg_t, budget), 0, 1 << 24, NULL},
    {"update-tokens", CM_CFG_INT, "1024",
     "retroinfer: tokens clustered per index update; a prompt under sink + window + this decodes densely",
     offsetof(gen_cfg_t, update_tokens), 16, 1 << 24, NULL},
    {"retrieval-min", CM_CFG_INT, "256",
     "retroinfer: floor of the retrieval zone in tokens (the 1.8% share starves short contexts)",
     offsetof(gen_cfg_t, retrieval_min), 0, 1 << 24, NULL},
    {"adapt-tau", CM_CFG_DOUBLE, "0",
     "retroinfer: output-aware per-head cut, the estimated mass a head may leave to estimation (0 = off)",
     offsetof(gen_cfg_t, adapt_tau), 0, 0.99, NULL},
    GEN_ITEM("dump-kv", CM_CFG_STRING, NULL, "write per-layer K/V and decode queries to this directory", dump_kv),
    GEN_ITEM("stream", CM_CFG_BOOL, "true", "print tokens as they are generated", stream),
    GEN_ITEM("stats", CM_CFG_BOOL, "true", "print prefill/decode speed at the end", stats),
    GEN_ITEM("act", CM_CFG_STRING, "",
             "decode activations: i16 (int16 blocks, exact to 1e-4), i8 (as ggml: faster, ~1e-2 logit error), f32 "
             "(empty = --model-act)",
             act),
};
/* The prompt may also come as the one positional argument (after the flags). */
static const cm_config_table_t gen_table = {"ri generate", "RI_GEN_", gen_items, CM_ARRAY_LEN(gen_items), 1, "[PROMPT]"};

static char *gen_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "ri generate: cannot open %s: %m\n", path);
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = cm_malloc(&gen_tag, cap);
    while (buf != NULL) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
        if (n + 1 == cap) {
            char *nb = cm_realloc(&gen_tag, buf, cap * 2);
            if (nb == NULL) {
                cm_free(buf);
                buf = NULL;
                break;
            }
            buf = nb, cap *= 2;
        }
    }
    fclose(f);
    if (buf != NULL)
        buf[n] = '\0';
    return buf;
}

static void gen_progress(void *arg, size_t done, size_t total)
{
    (void)arg;
    int w = 40, fill = (int)((double)done / (double)total * w);
    fprintf(stderr, "\rprefill [%.*s%*s] %zu/%zu", fill, "########################################", w - fill, "",
            done, total);
    if (done == total)
        fprintf(stderr, "\r%*s\r", w + 40, "");
    fflush(stderr);
}

/* Where generated tokens go: stdout as they come with --stream. */
typedef struct gen_stream {
    const mdl_tok_t *tok; /* borrowed */
    bool on;              /* --stream */
} gen_stream_t;

static void gen_print(void *arg, int32_t id)
{
    const gen_stream_t *o = arg;
    char piece[256];
    if (!o->on)
        return;
    int l = mdl_tok_piece(o->tok, id, piece, sizeof(piece));
    if (l > 0)
        fwrite(piece, 1, CM_MIN((size_t)l, sizeof(piece)), stdout);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    gen_cfg_t cfg;
    cm_config_result_t res;
    char err[512] = "";
    int rc = 1;
    if (cm_config_load(&gen_table, &cfg, argc, argv, &res, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri generate: %s\n", err);
        return 2;
    }
    if (res.help) {
        cm_config_usage(&gen_table, stdout);
        cm_config_free(&gen_table, &cfg);
        return 0;
    }
    if (res.dump) {
        cm_config_dump(&gen_table, &cfg, stdout);
        cm_config_free(&gen_table, &cfg);
        return 0;
    }
    mdl_model_t *model = NULL;
    mdl_seq_t *seq = NULL;
    mdl_sampler_t *sampler = NULL;
    mdl_kvdump_t *dump = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    char *text = NULL;
    size_t n_ids = 0;

    if (mdl_runtime_apply(&cfg.rt, err, sizeof(err)) != RI_OK) {
        fprintf(stderr, "ri generate: %s (try --help)\n", err);
        rc = 2;
        goto out;
    }
    if (cfg.prompt_file != NULL && cfg.prompt_file[0] != '\0') {
        if ((text = gen_read_file(cfg.prompt_file)) == NULL)
            goto out;
    } else if (cfg.prompt != NULL) {
        text = cm_strdup(&gen_tag, cfg.prompt);
    } else if (res.first_arg < argc) {
        text = cm_strdup(&gen_tag, argv[res.first_arg]);
    } else {
        fprintf(stderr, "ri generate: give --prompt TEXT or --prompt-file FILE (see --help)\n");
        goto out;
    }
    if (text == NULL) {
        fprintf(stderr, "ri generate: out of memory\n");
        goto out;
    }
    const mdl_attn_ops_t *attn = mdl_attn_find(cfg.attn);
    if (attn == NULL) {
        fprintf(stderr, "ri generate: unknown --attn '%s' (have: %s)\n", cfg.attn, mdl_attn_names());
        goto out;
    }
    char path[4096];
    if (mdl_model_resolve(cfg.model, path, sizeof(path)) != RI_OK) {
        fprintf(stderr, "ri generate: cannot find a model at %s; run `./ri model fetch` (or ./ri setup) or pass --model "
                        "NAME|PATH (names: %s)\n", path, mdl_model_names());
        goto out;
    }
    ri_status_t st = mdl_model_load(path, &model, err, sizeof(err));
    if (st != RI_OK) {
        fprintf(stderr, "ri generate: cannot load %s: %s\n", path, err);
        goto out;
    }
    mdl_model_set_chunk(model, (size_t)cfg.chunk);
    if (cfg.act[0] == '\0') {
        /* --model-act / RI_MODEL_ACT, applied with the other runtime settings */
    } else if (strcmp(cfg.act, "f32") == 0) {
        mdl_quant_set_act(MDL_ACT_F32);
    } else if (strcmp(cfg.act, "i8") == 0) {
        mdl_quant_set_act(MDL_ACT_I8);
    } else if (strcmp(cfg.act, "i16") == 0) {
        mdl_quant_set_act(MDL_ACT_I16);
    } else {
        fprintf(stderr, "ri generate: --act must be i16, i8 or f32\n");
        goto out;
    }
    const mdl_hparams_t *hp = mdl_model_hparams(model);
    const mdl_tok_t *tok = mdl_model_tok(model);
    if (cfg.chat && !mdl_tok_has_chat(tok)) {
        fprintf(stderr, "ri generate: %s has no chat template (a base model): drop --chat\n", mdl_model_name(model));
        goto out;
    }
    if (cfg.chat)
        st = mdl_tok_chat(tok, cfg.system && cfg.system[0] ? cfg.system : NULL, text, &ids, &n_ids);
    else
        st = mdl_tok_encode_prompt(tok, text, strlen(text), &ids, &n_ids);
    if (st != RI_OK || n_ids == 0) {
        fprintf(stderr, "ri generate: cannot tokenize the prompt: %s\n", st ? ri_status_str(st) : "it is empty");
        goto out;
    }
    size_t cap = cfg.ctx > 0 ? (size_t)cfg.ctx : n_ids + (size_t)cfg.max_tokens;
    if (cap < n_ids + 1) {
        fprintf(stderr, "ri generate: --ctx %zu cannot hold the %zu-token prompt\n", cap, n_ids);
        goto out;
    }
    if (cap > hp->n_ctx)
        fprintf(stderr, "ri generate: warning: %zu tokens exceed the model's trained context of %u\n", cap,
                hp->n_ctx);
    mdl_attn_cfg_t acfg;
    mdl_attn_cfg_default(&acfg);
    acfg.budget_tokens = (uint32_t)cfg.budget;
    acfg.wave.update_tokens = (uint32_t)cfg.update_tokens;
    acfg.wave.retrieval_min_tokens = (uint32_t)cfg.retrieval_min;
    acfg.wave.adapt_tau = (float)cfg.adapt_tau;
    if ((st = mdl_seq_create(model, attn, &acfg, cap, &seq)) != RI_OK) {
        fprintf(stderr, "ri generate: cannot create a %zu-token sequence: %s\n", cap, ri_status_str(st));
        goto out;
    }
    mdl_sampler_cfg_t scfg = {.temperature = (float)cfg.temperature, .top_p = (float)cfg.top_p,
                              .seed = (uint64_t)cfg.seed};
    if ((st = mdl_sampler_create(&scfg, hp->n_vocab, &sampler)) != RI_OK)
        goto out;
    if (cfg.dump_kv != NULL && cfg.dump_kv[0] != '\0') {
        if ((st = mdl_kvdump_create(hp, &dump)) != RI_OK)
            goto out;
        mdl_kvdump_attach(dump, seq);
    }
    logits = cm_malloc(&gen_tag, (size_t)hp->n_vocab * sizeof(float));
    if (logits == NULL)
        goto out;

    bool tty = isatty(1) && n_ids > 256;
    gen_stream_t out = {tok, cfg.stream};
    mdl_gen_cfg_t gcfg = {.max_tokens = (size_t)cfg.max_tokens, .smp = sampler, .on_token = gen_print,
                          .token_arg = &out, .progress = tty ? gen_progress : NULL};
    mdl_gen_result_t gres;
    if ((st = mdl_generate(model, seq, ids, n_ids, logits, &gcfg, &gres)) != RI_OK) {
        fprintf(stderr, "%sri generate: %s failed: %s\n", gres.decoding ? "\n" : "",
                gres.decoding ? "decode" : "prefill", ri_status_str(st));
        goto out;
    }
    double t_prefill = gres.prefill_s, t_decode = gres.decode_s;
    if (cfg.stream) {
        printf("\n");
        fflush(stdout);
    }
    size_t n_dec = gres.steps;
    if (cfg.stats) {
        mdl_attn_stats_t as;
        mdl_seq_attn_stats(seq, &as);
        fprintf(stderr,
                "[generate] model %s, attn %s, %u threads\n"
                "[generate] prefill: %zu tokens in %.2f s (%.1f tok/s)\n"
                "[generate] decode:  %zu tokens in %.2f s (%.1f tok/s)%s\n",
                mdl_model_name(model), attn->name, cm_pool_size(cm_pool_default()), n_ids, t_prefill,
                (double)n_ids / t_prefill, n_dec, t_decode, n_dec ? (double)n_dec / t_decode : 0.0, "");
        if (as.build_s > 0.0005)
            fprintf(stderr, "[generate] index build: %.3f s\n", as.build_s);
        /* What decode attended exactly, as a share of the context it had:
         * 100% for full attention, a few percent for an indexed sequence. */
        if (as.decode_steps > 0) {
            double ctx_mean = (double)n_ids + ((double)n_dec + 1.0) / 2.0;
            fprintf(stderr, "[generate] exact attention: %.1f tokens per step, %.1f%% of the context\n",
                    (double)as.exact_tokens / (double)as.decode_steps,
                    100.0 * (double)as.exact_tokens / (double)as.decode_steps / ctx_mean);
        }
    }
    if (dump != NULL) {
        if ((st = mdl_kvdump_write(dump, seq, cfg.dump_kv, n_ids, mdl_model_name(model))) != RI_OK) {
            fprintf(stderr, "ri generate: --dump-kv failed: %s\n", ri_status_str(st));
            goto out;
        }
        fprintf(stderr, "[generate] K/V of %zu tokens and %zu decode queries written to %s\n", mdl_seq_len(seq),
                n_dec, cfg.dump_kv);
    }
    rc = 0;
out:
    mdl_kvdump_destroy(dump);
    cm_free(logits);
    cm_free(ids);
    cm_free(text);
    mdl_sampler_destroy(sampler);
    mdl_seq_destroy(seq);
    mdl_model_destroy(model);
    cm_config_free(&gen_table, &cfg);
    return rc;
}
