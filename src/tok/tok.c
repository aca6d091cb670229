/*
 * tok/tok.c — what every tokenizer shares whatever file it came from:
 * destruction and the read-only queries.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/util.h"
#include "tok/tok_internal.h"

void tio_tok_destroy(tio_tok *tok)
{
    if (!tok)
        return;
    if (tok->key_created)
        pthread_key_delete(tok->key);
    tok_free_ctxs(tok);
    tok_free_stages(tok);
    pthread_mutex_destroy(&tok->ctx_lock);
    free(tok->arena);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->pieces);
    free(tok->pairs);
    free(tok->byte_pairs);
    free(tok->specials);
    free(tok);
}

uint32_t tio_tok_vocab_size(const tio_tok *tok) { return tok ? tok->n_ids : 0; }

int tio_tok_special_id(const tio_tok *tok, const char *text)
{
    if (!tok || !text)
        return tio_fail(-EINVAL, "tio_tok_special_id: NULL argument");
    size_t len = strlen(text);
    for (uint32_t i = 0; i < tok->n_specials; i++)
        if (tok->specials[i].len == len && !memcmp(tok->arena + tok->specials[i].off, text, len))
            return (int)tok->specials[i].id;
    return tio_fail(-ENOENT, "no special token '%s'", text);
}

int tio_tok_token_bytes(const tio_tok *tok, uint32_t id, const void **bytes, size_t *len)
{
    if (!tok || !bytes || !len)
        return tio_fail(-EINVAL, "tio_tok_token_bytes: NULL argument");
    if (id >= tok->n_ids || tok->tok_off[id] == TOK_NONE)
        return tio_fail(-ENOENT, "id %u is not a token", id);
    *bytes = tok->arena + tok->tok_off[id];
    *len = tok->tok_len[id];
    return 0;
}
