/*
 * The member side of the cluster directory (see cm_cluster.h): a node's
 * registration under its lease, and its part of each keepalive round:
 * renew the lease, publish changed figures, write queued prefix records,
 * and after an outage long enough for the lease to expire, grant a new
 * lease and write the node record and every prefix record again.  Callers
 * (the kvstore's request threads) only touch memory under c->mu.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_alloc.h"
#include "common/cm_cluster.h"
#include "common/cm_cluster_internal.h"
#include "common/cm_etcd_internal.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

/* Grant a lease of lease_ms and create the node record under it.  *lease_p
 * on success; on failure the lease is revoked. */
static ri_status_t cm_cluster_member_create(cm_cluster_t *c, const cm_cluster_node_t *self, uint32_t lease_ms,
                                            int64_t *lease_p)
{
    char key[CM_CLUSTER_KEY_MAX], *json = NULL;
    int64_t lease = 0;
    cm_cluster_node_key(c, self->name, key);
    ri_status_t st = cm_cluster_node_to_json(self, &json);
    if (st != RI_OK)
        return st;
    st = cm_etcd_lease_grant(c->etcd, (int64_t)((lease_ms + 999) / 1000), &lease);
    if (st == RI_OK) {
        st = cm_etcd_create(c->etcd, key, json, strlen(json), lease);
        if (st == RI_ERR_EXISTS)
            cm_etcd_set_error("cluster: a live node named \"%s\" is registered already", self->name);
        if (st != RI_OK) {
            char err[512];
            snprintf(err, sizeof(err), "%s", cm_etcd_last_error());
            cm_etcd_lease_revoke(c->etcd, lease);
            cm_etcd_set_error("%s", err);
        }
    }
    cm_free(json);
    if (st == RI_OK)
        *lease_p = lease;
    return st;
}

static int cm_cluster_held_find(const cm_cluster_t *c, const uint8_t key[32])
{
    for (size_t i = 0; i < c->n_held; i++) {
        if (memcmp(c->held[i], key, 32) == 0)
            return (int)i;
    }
    return -1;
}

ri_status_t cm_cluster_register(cm_cluster_t *c, const cm_cluster_node_t *self, uint32_t lease_ms)
{
    if (c == NULL || self == NULL || !cm_cluster_name_valid(self->name) || self->addr[0] == '\0' ||
        memchr(self->addr, '\0', sizeof(self->addr)) == NULL || (lease_ms != 0 && lease_ms < 2000)) {
        cm_etcd_set_error("cluster register: a valid node name, an address and a lease of at least 2000 ms are needed");
        return RI_ERR_INVALID;
    }
    if (lease_ms == 0)
        lease_ms = CM_CLUSTER_DEFAULT_LEASE_MS;
    pthread_mutex_lock(&c->mu);
    bool already = c->member;
    pthread_mutex_unlock(&c->mu);
    if (already) {
        cm_etcd_set_error("cluster register: registered already");
        return RI_ERR_INVALID;
    }
    int64_t lease = 0;
    ri_status_t st = cm_cluster_member_create(c, self, lease_ms, &lease);
    if (st != RI_OK)
        return st;
    pthread_mutex_lock(&c->mu);
    c->member = true;
    c->self = *self;
    c->lease_ms = lease_ms;
    c->lease = lease;
    c->renewed_ms = cm_cluster_now_ms();
    c->self_dirty = false;
    c->kick = c->n_ops > 0; /* prefixes noted before the registration */
    atomic_store(&c->registered, true);
    st = cm_cluster_thread_start_locked(c);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void cm_cluster_update(cm_cluster_t *c, const cm_cluster_node_t *self)
{
    if (c == NULL || self == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    c->self.pool_total = self->pool_total;
    c->self.pool_used = self->pool_used;
    c->self.sessions = self->sessions;
    if (memchr(self->tenants, '\0', sizeof(self->tenants)) != NULL)
        snprintf(c->self.tenants, sizeof(c->self.tenants), "%s", self->tenants);
    c->self_dirty = true;
    pthread_mutex_unlock(&c->mu);
}

/* Queue one prefix change (c->mu held).  False when out of memory: the
 * change is dropped (the record is then fixed by the next re-grant). */
static bool cm_cluster_op_push(cm_cluster_t *c, const uint8_t key[32], bool add)
{
    if (c->n_ops == c->cap_ops) {
        size_t cap = c->cap_ops ? c->cap_ops * 2 : 64;
        cm_cluster_prefix_op_t *ops = cm_realloc(&cm_cluster_tag, c->ops, cap * sizeof(*ops));
        if (ops == NULL)
            return false;
        c->ops = ops;
        c->cap_ops = cap;
    }
    memcpy(c->ops[c->n_ops].key, key, 32);
    c->ops[c->n_ops].add = add;
    c->n_ops++;
    c->kick = true;
    pthread_cond_broadcast(&c->cv);
    return true;
}

void cm_cluster_prefix_add(cm_cluster_t *c, const uint8_t key[32])
{
    if (c == NULL || key == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    if (cm_cluster_held_find(c, key) < 0) {
        if (c->n_held == c->cap_held) {
            size_t cap = c->cap_held ? c->cap_held * 2 : 64;
            uint8_t(*held)[32] = cm_realloc(&cm_cluster_tag, c->held, cap * 32);
            if (held == NULL) {
                pthread_mutex_unlock(&c->mu);
                cm_warn("cluster: out of memory noting a prefix block; it is not published");
                return;
            }
            c->held = held;
            c->cap_held = cap;
        }
        memcpy(c->held[c->n_held++], key, 32);
        cm_cluster_op_push(c, key, true);
    }
    pthread_mutex_unlock(&c->mu);
}

void cm_cluster_prefix_del(cm_cluster_t *c, const uint8_t key[32])
{
    if (c == NULL || key == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    int i = cm_cluster_held_find(c, key);
    if (i >= 0) {
        memmove(c->held[i], c->held[i + 1], (c->n_held - (size_t)i - 1) * 32);
        c->n_held--;
        cm_cluster_op_push(c, key, false);
    }
    pthread_mutex_unlock(&c->mu);
}

bool cm_cluster_registered(cm_cluster_t *c)
{
    return c != NULL && atomic_load(&c->registered);
}

/* Write the queued prefix changes in order; stop at the first failure and
 * keep the rest (in order, before anything queued meanwhile). */
static void cm_cluster_member_flush_ops(cm_cluster_t *c, int64_t lease, const char *node)
{
    pthread_mutex_lock(&c->mu);
    cm_cluster_prefix_op_t *ops = c->ops;
    size_t n = c->n_ops, cap = c->cap_ops;
    c->ops = NULL;
    c->n_ops = c->cap_ops = 0;
    pthread_mutex_unlock(&c->mu);
    size_t done = 0;
    for (; done < n; done++) {
        char key[CM_CLUSTER_KEY_MAX];
        cm_cluster_prefix_key(c, ops[done].key, node, key);
        ri_status_t st =
            ops[done].add ? cm_etcd_put(c->etcd, key, "", 0, lease) : cm_etcd_delete(c->etcd, key, false, NULL);
        if (st != RI_OK)
            break;
    }
    pthread_mutex_lock(&c->mu);
    if (done < n) {
        /* put the rest back in front of what came meanwhile */
        size_t rest = n - done, total = rest + c->n_ops;
        if (cap < total) {
            cm_cluster_prefix_op_t *grown = cm_realloc(&cm_cluster_tag, ops, total * sizeof(*ops));
            if (grown != NULL) {
                ops = grown;
                cap = total;
            }
        }
        memmove(ops, ops + done, rest * sizeof(*ops));
        size_t keep = c->n_ops <= cap - rest ? c->n_ops : cap - rest;
        memcpy(ops + rest, c->ops, keep * sizeof(*ops));
        cm_free(c->ops);
        c->ops = ops;
        c->n_ops = rest + keep;
        c->cap_ops = cap;
    } else {
        cm_free(ops);
    }
    pthread_mutex_unlock(&c->mu);
}

/* After the lease expired: a new lease, the node record and every prefix
 * record again. */
static void cm_cluster_member_regrant(cm_cluster_t *c)
{
    pthread_mutex_lock(&c->mu);
    cm_cluster_node_t self = c->self;
    uint32_t lease_ms = c->lease_ms;
    c->self_dirty = false;
    pthread_mutex_unlock(&c->mu);
    int64_t lease = 0;
    ri_status_t st = cm_cluster_member_create(c, &self, lease_ms, &lease);
    if (st != RI_OK) {
        if (st == RI_ERR_EXISTS)
            cm_warn("cluster: cannot register again as %s: another live node has the name", self.name);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->lease = lease;
    c->renewed_ms = cm_cluster_now_ms();
    /* every held block becomes one queued put; older queued changes are
     * folded into the held set already */
    c->n_ops = 0;
    for (size_t i = 0; i < c->n_held; i++)
        cm_cluster_op_push(c, c->held[i], true);
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->registered, true);
    cm_info("cluster: registered again as %s after the lease expired", self.name);
    cm_cluster_member_flush_ops(c, lease, self.name);
}

/* Publish the figures set by cm_cluster_update. */
static void cm_cluster_member_publish(cm_cluster_t *c, int64_t lease)
{
    pthread_mutex_lock(&c->mu);
    bool dirty = c->self_dirty;
    cm_cluster_node_t self = c->self;
    c->self_dirty = false;
    pthread_mutex_unlock(&c->mu);
    if (!dirty)
        return;
    char key[CM_CLUSTER_KEY_MAX], *json = NULL;
    cm_cluster_node_key(c, self.name, key);
    ri_status_t st = cm_cluster_node_to_json(&self, &json);
    if (st == RI_OK)
        st = cm_etcd_put(c->etcd, key, json, strlen(json), lease);
    cm_free(json);
    if (st != RI_OK) {
        pthread_mutex_lock(&c->mu);
        c->self_dirty = true;
        pthread_mutex_unlock(&c->mu);
    }
}

void cm_cluster_member_tick(cm_cluster_t *c)
{
    pthread_mutex_lock(&c->mu);
    bool member = c->member;
    int64_t lease = c->lease;
    uint64_t renewed = c->renewed_ms;
    uint32_t lease_ms = c->lease_ms;
    char node[CM_CLUSTER_NAME_MAX];
    snprintf(node, sizeof(node), "%s", c->self.name);
    pthread_mutex_unlock(&c->mu);
    if (!member)
        return;
    if (lease == 0) {
        cm_cluster_member_regrant(c);
        return;
    }
    ri_status_t st = cm_etcd_lease_keepalive(c->etcd, lease, NULL);
    if (st == RI_OK) {
        pthread_mutex_lock(&c->mu);
        c->renewed_ms = cm_cluster_now_ms();
        pthread_mutex_unlock(&c->mu);
        atomic_store(&c->registered, true);
        cm_cluster_member_publish(c, lease);
        cm_cluster_member_flush_ops(c, lease, node);
    } else if (st == RI_ERR_NOT_FOUND) {
        /* expired while etcd could not hear us: our records are gone */
        atomic_store(&c->registered, false);
        pthread_mutex_lock(&c->mu);
        c->lease = 0;
        pthread_mutex_unlock(&c->mu);
        cm_warn("cluster: the lease of %s expired; registering again", node);
        cm_cluster_member_regrant(c);
    } else if (cm_cluster_now_ms() - renewed > lease_ms) {
        atomic_store(&c->registered, false);
    }
}

void cm_cluster_member_leave(cm_cluster_t *c)
{
    if (c->member && c->lease != 0)
        cm_etcd_lease_revoke(c->etcd, c->lease); /* deletes the node and prefix records */
    c->lease = 0;
    atomic_store(&c->registered, false);
}

void cm_cluster_member_free(cm_cluster_t *c)
{
    cm_free(c->held);
    cm_free(c->ops);
    c->held = NULL;
    c->ops = NULL;
    c->n_held = c->n_ops = 0;
}
