/*
 * Tokenizers built from GGUF metadata:
 *  - byte-level BPE (GPT-2 style, tokenizer.ggml.model "gpt2", SmolLM2):
 *    tokenizer.ggml.tokens / token_type / merges, the pre-tokenizer named by
 *    tokenizer.ggml.pre, special tokens (control and user-defined types) and
 *    the SmolLM2 (ChatML) chat template;
 *  - SentencePiece BPE ("llama", Gemma 3): spaces escaped as U+2581, pieces
 *    merged by token score (tokenizer.ggml.scores), <0xXX> byte fallback for
 *    characters outside the vocabulary, user-defined tokens ("\n\n", tabs)
 *    split out of the text first; no chat template.  Workload: a prompt of up to a few ten
 * thousand characters per request; decode one token at a time while streaming.
 *
 * Unicode classes for the pre-tokenizer regex (\p{L}, \p{N}, \s) are exact for
 * ASCII and Latin-1 and approximated by block ranges elsewhere (docs/model.md).
 */
#ifndef MDL_TOK_H
#define MDL_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuworker/model/mdl_gguf.h"
#include "retroinfer/status.h"

typedef struct mdl_tok mdl_tok_t;

/* Build from an open GGUF (borrowed only during the call: strings are
 * copied).  RI_ERR_UNSUPPORTED for tokenizer models other than "gpt2",
 * RI_ERR_FORMAT (message in err) for inconsistent metadata.  Caller frees
 * with mdl_tok_destroy. */
ri_status_t mdl_tok_create(const mdl_gguf_t *g, mdl_tok_t **tok_p, char *err, size_t errlen);

/* Free; NULL is a no-op. */
void mdl_tok_destroy(mdl_tok_t *tok);

/* Number of tokens in the vocabulary. */
size_t mdl_tok_vocab(const mdl_tok_t *tok);

/* Token ids: beginning/end of sequence, ChatML end of turn (-1 if absent). */
int32_t mdl_tok_bos(const mdl_tok_t *tok);
int32_t mdl_tok_eos(const mdl_tok_t *tok);
int32_t mdl_tok_eot(const mdl_tok_t *tok);

/* True when prompts start with the bos token (tokenizer.ggml.add_bos_token;
 * default true for SentencePiece, false for BPE).  mdl_tok_encode never adds
 * it: the caller building a prompt does. */
bool mdl_tok_add_bos(const mdl_tok_t *tok);

/* True when the vocabulary has the ChatML tokens mdl_tok_chat needs. */
bool mdl_tok_has_chat(const mdl_tok_t *tok);

/* True when generation should stop at this token (eos, end of turn). */
bool mdl_tok_is_stop(const mdl_tok_t *tok, int32_t id);

/* Encode len bytes of UTF-8 text.  With parse_special, control and
 * user-defined token texts ("<|im_start|>") become their ids; otherwise they
 * are plain text.  *ids_p is a new array (caller frees with cm_free) of
 * *n_p ids.  Invalid UTF-8 bytes are encoded as single bytes. */
ri_status_t mdl_tok_encode(const mdl_tok_t *tok, const char *text, size_t len, bool parse_special,
                           int32_t **ids_p, size_t *n_p);

/* A plain-text prompt (no special tokens parsed), with bos first when the
 * model wants one (mdl_tok_add_bos).  Output as mdl_tok_encode. */
ri_status_t mdl_tok_encode_prompt(const mdl_tok_t *tok, const char *text, size_t len, int32_t **ids_p, size_t *n_p);

/* The bytes of one token (special tokens give their text).  Writes at most
 * cap bytes to buf and returns the full length; -1 for an unknown id. */
int mdl_tok_piece(const mdl_tok_t *tok, int32_t id, char *buf, size_t cap);

/* Decode ids into a new NUL-terminated string (caller frees with cm_free);
 * skip_special leaves out control tokens. */
ri_status_t mdl_tok_decode(const mdl_tok_t *tok, const int32_t *ids, size_t n, bool skip_special, char **text_p);

/* One chat message: role ("system", "user", "assistant", ...) and content,
 * both UTF-8 text (borrowed). */
typedef struct mdl_chat_msg {
    const char *role;
    const char *content;
} mdl_chat_msg_t;

/* Apply the chat template to a conversation of n_msgs messages (a default
 * system turn first when msgs[0] is not one), ending with the assistant turn
 * opener, and encode it.  Neither roles nor contents are parsed for special
 * tokens.  Output as mdl_tok_encode; RI_ERR_UNSUPPORTED for a vocabulary
 * without a chat template (mdl_tok_has_chat false). */
ri_status_t mdl_tok_chat_msgs(const mdl_tok_t *tok, const mdl_chat_msg_t *msgs, size_t n_msgs, int32_t **ids_p,
                              size_t *n_p);

/* Apply the chat template to one user message (system prompt optional: NULL
 * uses the model's default), ending with the assistant turn opener, and
 * encode it.  Output as mdl_tok_encode. */
ri_status_t mdl_tok_chat(const mdl_tok_t *tok, const char *system, const char *user, int32_t **ids_p,
                         size_t *n_p);

#endif /* MDL_TOK_H */
