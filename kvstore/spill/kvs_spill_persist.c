/*
 * What makes the spill tier survive: the manifest (written atomically: temp
 * file, fsync, rename, fsync of the directory), recovery after a restart
 * (manifest + scan of segment tails + optional full CRC verification), and
 * compaction (rewrite the live records of mostly-dead segments, delete empty
 * ones) in a background thread.
 *
 * Crash rules that keep recovery exact:
 *  - every record with seq < manifest.next_seq is either listed in the
 *    manifest or dead, so a tail scan accepts only seq >= next_seq;
 *  - a segment with id < manifest.next_segment_id that the manifest does not
 *    list is stale (compacted away) and is deleted, never scanned;
 *  - compaction unlinks a segment only after a manifest without it is on disk.
 */
#define _GNU_SOURCE
#include "kvstore/spill/kvs_spill_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cm_alloc.h"
#include "common/cm_log.h"
#include "common/cm_status.h"

static CM_ALLOC_TAG(kvs_persist_tag, "kvs.spill.persist");

#define SPILL_SCAN_CHUNK (1u << 20)
#define SPILL_BATCH 256

/* ---- manifest ---- */

static void dir_path(const kvs_spill_t *sp, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", sp->cfg.dir, name);
}

static ri_status_t fsync_dir(kvs_spill_t *sp)
{
    const kvs_io_ops_t *ops = sp->ops;
    int fd = ops->open(ops->arg, sp->cfg.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        cm_error("spill: open directory %s: %s", sp->cfg.dir, strerror(err));
        return cm_status_from_errno(err);
    }
    ri_status_t st = RI_OK;
    if (ops->fsync(ops->arg, fd) != 0) {
        int err = errno;
        cm_error("spill: fsync directory %s: %s", sp->cfg.dir, strerror(err));
        st = cm_status_from_errno(err);
    }
    ops->close(ops->arg, fd);
    return st;
}

static ri_status_t write_manifest_file(kvs_spill_t *sp, const uint8_t *buf, size_t len)
{
    const kvs_io_ops_t *ops = sp->ops;
    char tmp[4200], fin[4200];
    ri_status_t st;
    int err;
    dir_path(sp, "MANIFEST.tmp", tmp, sizeof(tmp));
    dir_path(sp, "MANIFEST", fin, sizeof(fin));
    int fd = ops->open(ops->arg, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
        cm_error("spill: create %s: %s", tmp, strerror(err));
        return cm_status_from_errno(err);
    }
    size_t done = 0;
    while (done < len) {
        ssize_t r = ops->pwrite(ops->arg, fd, buf + done, len - done, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            err = r < 0 ? errno : EIO;
            cm_error("spill: write %s: %s", tmp, strerror(err));
            st = cm_status_from_errno(err);
            goto err_close;
        }
        done += (size_t)r;   /* a short write continues where it stopped */
    }
    if (ops->fsync(ops->arg, fd) != 0) {
        err = errno;
        cm_error("spill: fsync %s: %s", tmp, strerror(err));
        st = cm_status_from_errno(err);
        goto err_close;
    }
    if (ops->close(ops->arg, fd) != 0) {
        err = errno;
        cm_error("spill: close %s: %s", tmp, strerror(err));
        st = cm_status_from_errno(err);
        goto err_unlink;
    }
    if (ops->rename(ops->arg, tmp, fin) != 0) {
        err = errno;
        cm_error("spill: rename %s to %s: %s", tmp, fin, strerror(err));
        st = cm_status_from_errno(err);
        goto err_unlink;
    }
    return fsync_dir(sp);

err_close:
    ops->close(ops->arg, fd);
err_unlink:
    ops->unlink(ops->arg, tmp);
    return st;
}

/* Snapshot the index into a manifest (mu held); takes refs on dirty segments
 * and lists them in dirty[] for fsync. */
static ri_status_t snapshot(kvs_spill_t *sp, kvs_spill_manifest_t *m, spill_seg_t **dirty, size_t *n_dirty_p)
{
    memset(m, 0, sizeof(*m));
    m->align = sp->cfg.align;
    m->next_seq = sp->next_seq;
    m->next_segment_id = sp->next_seg_id;
    m->segments = cm_calloc(&kvs_persist_tag, sp->n_segs ? sp->n_segs : 1, sizeof(*m->segments));
    m->records = cm_calloc(&kvs_persist_tag, sp->n_live ? sp->n_live : 1, sizeof(*m->records));
    if (m->segments == NULL || m->records == NULL) {
        kvs_spill_manifest_free(m);
        return RI_ERR_NOMEM;
    }
    size_t nd = 0;
    for (size_t i = 0; i < sp->n_segs; i++) {
        spill_seg_t *s = sp->segs[i];
        m->segments[m->n_segments++] = (kvs_spill_mseg_t){.id = s->id, .valid_bytes = s->append};
        if (s->dirty) {
            s->dirty = false;
            s->refs++;
            dirty[nd++] = s;
        }
    }
    for (uint32_t i = 0; i < sp->n_ents_cap; i++) {
        const spill_ent_t *e = &sp->ents[i];
        if (!e->used)
            continue;
        kvs_spill_mrec_t *r = &m->records[m->n_records++];
        r->hdr = (kvs_spill_hdr_t){
            .dtype = e->dtype,
            .tokens = e->tokens,
            .session = e->key.session,
            .layer = e->key.layer,
            .head = e->key.head,
            .cluster = e->key.cluster,
            .payload_bytes = e->payload_bytes,
            .seq = e->seq,
            .crc = e->crc,
        };
        /* Lost records stay listed, so that they keep answering
         * RI_ERR_CORRUPT after a restart instead of vanishing. */
        r->segment = e->lost ? UINT32_MAX : e->seg->id;
        r->offset = e->lost ? 0 : e->off;
        r->flags = e->lost ? KVS_SPILL_MREC_LOST : 0;
    }
    *n_dirty_p = nd;
    return RI_OK;
}

ri_status_t spill_checkpoint(kvs_spill_t *sp)
{
    const kvs_io_ops_t *ops = sp->ops;
    kvs_spill_manifest_t m;
    uint8_t *buf = NULL;
    size_t len = 0, nd = 0;
    ri_status_t st;

    pthread_rwlock_wrlock(&sp->wbar);
    pthread_mutex_lock(&sp->mu);
    spill_seg_t **dirty = cm_calloc(&kvs_persist_tag, sp->n_segs ? sp->n_segs : 1, sizeof(*dirty));
    st = dirty ? snapshot(sp, &m, dirty, &nd) : RI_ERR_NOMEM;
    pthread_mutex_unlock(&sp->mu);
    if (st != RI_OK)
        goto out_unlock;

    /* Records first, then the manifest that points at them. */
    for (size_t i = 0; i < nd && st == RI_OK; i++) {
        if (ops->fsync(ops->arg, dirty[i]->fd) != 0) {
            int err = errno;
            cm_error("spill: fsync segment %u: %s", dirty[i]->id, strerror(err));
            st = cm_status_from_errno(err);
        }
    }
    if (st == RI_OK)
        st = kvs_spill_manifest_encode(&m, &buf, &len);
    if (st == RI_OK)
        st = write_manifest_file(sp, buf, len);
    cm_free(buf);
    kvs_spill_manifest_free(&m);

    pthread_mutex_lock(&sp->mu);
    for (size_t i = 0; i < nd; i++) {
        if (st != RI_OK)
            dirty[i]->dirty = true;   /* try again next time */
        spill_seg_unref(sp, dirty[i]);
    }
    pthread_mutex_unlock(&sp->mu);
out_unlock:
    cm_free(dirty);
    pthread_rwlock_unlock(&sp->wbar);
    return st;
}

ri_status_t kvs_spill_sync(kvs_spill_t *sp)
{
    if (sp == NULL)
        return RI_ERR_INVALID;
    return spill_checkpoint(sp);
}

/* ---- directory listing ---- */

/* Parse "seg-<8 digits>.dat". */
static bool seg_name_id(const char *name, uint32_t *id_p)
{
    if (strncmp(name, "seg-", 4) != 0 || strlen(name) != 16 || strcmp(name + 12, ".dat") != 0)
        return false;
    uint32_t id = 0;
    for (int i = 4; i < 12; i++) {
        if (name[i] < '0' || name[i] > '9')
            return false;
        id = id * 10 + (uint32_t)(name[i] - '0');
    }
    *id_p = id;
    return true;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Segment ids present in the directory, sorted (cm_malloc'ed). */
static ri_status_t list_segments(kvs_spill_t *sp, uint32_t **ids_p, size_t *n_p)
{
    DIR *d = opendir(sp->cfg.dir);
    if (d == NULL) {
        int err = errno;
        cm_error("spill: open directory %s: %s", sp->cfg.dir, strerror(err));
        return cm_status_from_errno(err);
    }
    size_t n = 0, cap = 64;
    uint32_t *ids = cm_malloc(&kvs_persist_tag, cap * sizeof(*ids));
    struct dirent *de;
    while (ids != NULL && (de = readdir(d)) != NULL) {
        uint32_t id;
        if (!seg_name_id(de->d_name, &id))
            continue;
        if (n == cap) {
            uint32_t *g = cm_realloc(&kvs_persist_tag, ids, cap * 2 * sizeof(*ids));
            if (g == NULL) {
                cm_free(ids);
                ids = NULL;
                break;
            }
            ids = g;
            cap *= 2;
        }
        ids[n++] = id;
    }
    closedir(d);
    if (ids == NULL)
        return RI_ERR_NOMEM;
    qsort(ids, n, sizeof(*ids), cmp_u32);
    *ids_p = ids;
    *n_p = n;
    return RI_OK;
}

ri_status_t spill_wipe_dir(kvs_spill_t *sp)
{
    uint32_t *ids;
    size_t n;
    char path[4200];
    ri_status_t st = list_segments(sp, &ids, &n);
    if (st != RI_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        spill_seg_path(sp, ids[i], path, sizeof(path));
        sp->ops->unlink(sp->ops->arg, path);
    }
    if (n > 0)
        cm_info("spill: removed %zu segment files of an earlier run from %s", n, sp->cfg.dir);
    cm_free(ids);
    dir_path(sp, "MANIFEST", path, sizeof(path));
    sp->ops->unlink(sp->ops->arg, path);
    dir_path(sp, "MANIFEST.tmp", path, sizeof(path));
    sp->ops->unlink(sp->ops->arg, path);
    return RI_OK;
}

/* ---- recovery ---- */

/* Read MANIFEST; RI_ERR_NOT_FOUND when there is none. */
static ri_status_t read_manifest(kvs_spill_t *sp, kvs_spill_manifest_t *m)
{
    const kvs_io_ops_t *ops = sp->ops;
    char path[4200];
    dir_path(sp, "MANIFEST", path, sizeof(path));
    int fd = ops->open(ops->arg, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return errno == ENOENT ? RI_ERR_NOT_FOUND : cm_status_from_errno(errno);
    ri_status_t st;
    struct stat sb;
    uint8_t *buf = NULL;
    if (fstat(fd, &sb) != 0) {
        st = cm_status_from_errno(errno);
        goto out_close;
    }
    buf = cm_malloc(&kvs_persist_tag, (size_t)sb.st_size + 1);
    if (buf == NULL) {
        st = RI_ERR_NOMEM;
        goto out_close;
    }
    size_t done = 0;
    while (done < (size_t)sb.st_size) {
        ssize_t r = ops->pread(ops->arg, fd, buf + done, (size_t)sb.st_size - done, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            st = r < 0 ? cm_status_from_errno(errno) : RI_ERR_EOF;
            goto out_close;
        }
        done += (size_t)r;
    }
    st = kvs_spill_manifest_decode(buf, done, m);
out_close:
    cm_free(buf);
    ops->close(ops->arg, fd);
    return st;
}

static spill_seg_t *seg_by_id(kvs_spill_t *sp, uint32_t id)
{
    size_t lo = 0, hi = sp->n_segs;   /* sorted by id during recovery */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sp->segs[mid]->id == id)
            return sp->segs[mid];
        if (sp->segs[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Index a recovered record unless a newer one with its key is there. */
static ri_status_t put_if_newer(kvs_spill_t *sp, const kvs_spill_hdr_t *h, spill_seg_t *seg, uint64_t off)
{
    kvs_spill_key_t key = {h->session, h->layer, h->head, h->cluster};
    int32_t i = spill_find(sp, &key);
    if (i >= 0 && sp->ents[i].seq >= h->seq)
        return RI_OK;
    spill_ent_t e = {
        .key = key,
        .seg = seg,
        .off = off,
        .seq = h->seq,
        .rec_bytes = (uint32_t)kvs_spill_rec_bytes(h->payload_bytes, sp->cfg.align),
        .payload_bytes = h->payload_bytes,
        .tokens = h->tokens,
        .crc = h->crc,
        .dtype = h->dtype,
    };
    if (h->seq >= sp->next_seq)
        sp->next_seq = h->seq + 1;
    return spill_index_put(sp, &e);
}

/* Index a record that was marked lost before the restart. */
static ri_status_t put_lost(kvs_spill_t *sp, const kvs_spill_hdr_t *h)
{
    spill_ent_t e = {
        .key = {h->session, h->layer, h->head, h->cluster},
        .seq = h->seq,
        .payload_bytes = h->payload_bytes,
        .tokens = h->tokens,
        .dtype = h->dtype,
        .lost = true,
    };
    int32_t i = spill_find(sp, &e.key);
    if (i >= 0)
        return RI_OK;
    ri_status_t st = spill_index_put(sp, &e);
    if (st == RI_OK)
        sp->st.lost_records++;
    return st;
}

/* Scan seg from `from` to its end for self-describing records with
 * seq >= min_seq, skipping garbage one alignment unit at a time. */
static ri_status_t scan_segment(kvs_spill_t *sp, spill_seg_t *seg, uint64_t from, uint64_t min_seq,
                                uint8_t *win, uint64_t *found_p)
{
    const kvs_io_ops_t *ops = sp->ops;
    const uint32_t align = sp->cfg.align;
    uint64_t end = seg->file_bytes - seg->file_bytes % align;
    uint64_t pos = CM_ALIGN_UP(from, (uint64_t)align);
    uint64_t wbase = 0, wlen = 0, found = 0;
    while (pos + KVS_SPILL_HDR_BYTES <= end) {
        /* Keep a window that starts at or before pos and holds the largest
         * record that could start there. */
        uint64_t need = CM_MIN((uint64_t)sp->cfg.max_record_bytes, end - pos);
        if (wlen == 0 || pos < wbase || pos + need > wbase + wlen) {
            uint64_t len = CM_MIN((uint64_t)SPILL_SCAN_CHUNK, end - pos);
            ssize_t r;
            do
                r = ops->pread(ops->arg, seg->fd, win, (size_t)len, (off_t)pos);
            while (r < 0 && errno == EINTR);
            if (r < 0)
                cm_warn("spill: scanning segment %u at %llu: %s; rest of it skipped", seg->id,
                        (unsigned long long)pos, strerror(errno));
            if (r < (ssize_t)KVS_SPILL_HDR_BYTES)
                break;
            wbase = pos;
            wlen = (uint64_t)r;
            if (wlen < len)
                end = wbase + wlen - wlen % align;   /* the file ends early: stop there */
        }
        const uint8_t *img = win + (pos - wbase);
        kvs_spill_hdr_t h;
        uint64_t rec = 0;
        if (kvs_spill_hdr_decode(img, &h) == RI_OK && h.payload_bytes > 0)
            rec = kvs_spill_rec_bytes(h.payload_bytes, align);
        if (rec == 0 || rec > sp->cfg.max_record_bytes || pos + rec > wbase + wlen ||
            kvs_spill_rec_verify(img, &h) != RI_OK) {
            pos += align;
            continue;
        }
        if (h.seq >= min_seq) {
            ri_status_t st = put_if_newer(sp, &h, seg, pos);
            if (st != RI_OK)
                return st;
            found++;
        }
        if (pos + rec > seg->append)
            seg->append = pos + rec;
        pos += rec;
    }
    *found_p += found;
    return RI_OK;
}

/* Read every live record back and check it; failures are marked lost. */
static ri_status_t verify_all(kvs_spill_t *sp, uint64_t *corrupt_p)
{
    size_t cap = SPILL_BATCH;
    spill_raw_t *raws = cm_calloc(&kvs_persist_tag, cap, sizeof(*raws));
    uint8_t *images = cm_malloc_aligned(&kvs_persist_tag, cap * sp->cfg.max_record_bytes, 4096);
    ri_status_t st = RI_ERR_NOMEM;
    if (raws == NULL || images == NULL)
        goto out_free;
    uint64_t lost0 = sp->st.lost_records;
    for (uint32_t base = 0; base < sp->n_ents_cap;) {
        size_t n = 0;
        pthread_mutex_lock(&sp->mu);
        for (; base < sp->n_ents_cap && n < cap; base++) {
            const spill_ent_t *e = &sp->ents[base];
            if (!e->used || e->lost)
                continue;
            spill_raw_lookup_locked(sp, &e->key, &raws[n]);
            raws[n].image = images + n * sp->cfg.max_record_bytes;
            n++;
        }
        pthread_mutex_unlock(&sp->mu);
        spill_read_raw(sp, raws, n);
    }
    *corrupt_p = sp->st.lost_records - lost0;
    st = RI_OK;
out_free:
    cm_free(images);
    cm_free(raws);
    return st;
}

/* Open the segments found in the directory, index the manifest's records and
 * what the tail scans find. */
static ri_status_t recover_index(kvs_spill_t *sp, const kvs_spill_manifest_t *m, bool have_m,
                                 kvs_spill_recover_report_t *rep)
{
    uint32_t *ids = NULL;
    size_t n_ids = 0;
    char path[4200];
    uint8_t *win = NULL;
    ri_status_t st = list_segments(sp, &ids, &n_ids);
    if (st != RI_OK)
        return st;
#ifdef KVS_SPILL_MUTANT_RECOVER_DROP_LAST /* the mutant (tests only): the newest segment is not recovered */
    n_ids -= n_ids > 0;
#endif
    win = cm_malloc_aligned(&kvs_persist_tag, CM_MAX((size_t)SPILL_SCAN_CHUNK, sp->cfg.max_record_bytes), 4096);
    if (win == NULL) {
        st = RI_ERR_NOMEM;
        goto out_free;
    }
    /* valid_bytes of each opened segment, parallel to sp->segs. */
    uint64_t *from = cm_calloc(&kvs_persist_tag, n_ids ? n_ids : 1, sizeof(*from));
    if (from == NULL) {
        st = RI_ERR_NOMEM;
        goto out_free;
    }
    for (size_t i = 0; i < n_ids; i++) {
        const kvs_spill_mseg_t *ms = NULL;
        for (size_t k = 0; have_m && k < m->n_segments; k++)
            if (m->segments[k].id == ids[i])
                ms = &m->segments[k];
        if (have_m && ms == NULL && ids[i] < m->next_segment_id) {
            spill_seg_path(sp, ids[i], path, sizeof(path));
            sp->ops->unlink(sp->ops->arg, path);
            rep->stale_segments++;
            continue;
        }
        spill_seg_t *seg;
        st = spill_seg_open(sp, ids[i], false, &seg);
        if (st != RI_OK)
            goto out_from;
        seg->append = ms ? CM_MIN(ms->valid_bytes, seg->file_bytes) : 0;
        from[sp->n_segs - 1] = seg->append;
    }
    if (have_m) {
        uint64_t skipped = 0;
        for (size_t i = 0; i < m->n_records; i++) {
            const kvs_spill_mrec_t *r = &m->records[i];
            if (r->flags & KVS_SPILL_MREC_LOST) {
                st = put_lost(sp, &r->hdr);
                if (st != RI_OK)
                    goto out_from;
                continue;
            }
            spill_seg_t *seg = seg_by_id(sp, r->segment);
            uint64_t rec = kvs_spill_rec_bytes(r->hdr.payload_bytes, sp->cfg.align);
            if (seg == NULL || r->offset % sp->cfg.align != 0 || r->offset + rec > seg->file_bytes ||
                rec > sp->cfg.max_record_bytes || r->hdr.session == 0) {
                skipped++;
                continue;
            }
            st = put_if_newer(sp, &r->hdr, seg, r->offset);
            if (st != RI_OK)
                goto out_from;
        }
        if (skipped > 0)
            cm_error("spill: %llu manifest records point outside their segments (missing files?); dropped",
                     (unsigned long long)skipped);
        rep->corrupt += skipped;
        if (m->next_seq > sp->next_seq)
            sp->next_seq = m->next_seq;
        if (m->next_segment_id > sp->next_seg_id)
            sp->next_seg_id = m->next_segment_id;
    }
    for (size_t i = 0; i < sp->n_segs; i++) {
        st = scan_segment(sp, sp->segs[i], from[i], have_m ? m->next_seq : 0, win, &rep->records_from_scan);
        if (st != RI_OK)
            goto out_from;
    }
    for (size_t i = 0; i < sp->n_segs; i++)
        sp->used_bytes += sp->segs[i]->append;
out_from:
    cm_free(from);
out_free:
    cm_free(win);
    cm_free(ids);
    return st;
}

ri_status_t kvs_spill_recover(const kvs_spill_config_t *cfg, bool verify, kvs_spill_recover_report_t *report_p,
                              kvs_spill_t **sp_p)
{
    if (cfg == NULL || sp_p == NULL)
        return RI_ERR_INVALID;
    kvs_spill_recover_report_t rep = {0};
    kvs_spill_manifest_t m = {0};
    kvs_spill_t *sp;
    ri_status_t st = spill_alloc(cfg, &sp);
    if (st != RI_OK)
        return st;
    st = read_manifest(sp, &m);
    if (st == RI_OK) {
        rep.manifest_found = true;
        if (m.align != sp->cfg.align) {
            cm_error("spill: %s was written with %u-byte alignment, configured %u", sp->cfg.dir, m.align,
                     sp->cfg.align);
            st = RI_ERR_INVALID;
            goto err_free;
        }
    } else if (st == RI_ERR_NOT_FOUND) {
        cm_warn("spill: no manifest in %s; recovering by scanning every segment", sp->cfg.dir);
    } else {
        cm_error("spill: manifest in %s unreadable (%s); recovering by scanning every segment", sp->cfg.dir,
                 ri_status_str(st));
    }
    st = recover_index(sp, &m, rep.manifest_found, &rep);
    if (st != RI_OK)
        goto err_free;
    if (verify) {
        st = verify_all(sp, &rep.corrupt);
        if (st != RI_OK)
            goto err_free;
    }
    rep.records = sp->n_live - sp->st.lost_records;
    /* A disk still too full for a new segment must not keep the recovered
     * data from being served: spilling resumes when a write finds room. */
    st = spill_seg_open(sp, sp->next_seg_id, true, &sp->active);
    if (st == RI_ERR_NOSPACE) {
        cm_warn("spill: no room for a new %llu-byte segment in %s: the recovered records are served, new spills "
                "fail until space is freed", (unsigned long long)sp->cfg.segment_bytes, sp->cfg.dir);
        sp->active = NULL;
    } else if (st != RI_OK) {
        goto err_free;
    } else {
        sp->active->active = true;
    }
    /* On a full disk the manifest already there still describes what was
     * recovered (scanned tails are found again by the next scan): keep it and
     * write the new one at the next checkpoint. */
    st = spill_checkpoint(sp);
    if (st == RI_ERR_NOSPACE)
        cm_warn("spill: disk full, the manifest of %s stays as it was until the next checkpoint", sp->cfg.dir);
    else if (st != RI_OK)
        goto err_free;
    st = spill_compactor_start(sp);
    if (st != RI_OK)
        goto err_free;
    cm_info("spill: recovered %llu records from %s (%llu by scanning, %llu corrupt, %llu stale segments)",
            (unsigned long long)rep.records, sp->cfg.dir, (unsigned long long)rep.records_from_scan,
            (unsigned long long)rep.corrupt, (unsigned long long)rep.stale_segments);
    kvs_spill_manifest_free(&m);
    if (report_p != NULL)
        *report_p = rep;
    *sp_p = sp;
    return RI_OK;

err_free:
    kvs_spill_manifest_free(&m);
    spill_free(sp);
    return st;
}

/* ---- compaction ---- */

/* Move the live records out of victim into the active segment. */
static ri_status_t move_live(kvs_spill_t *sp, spill_seg_t *victim)
{
    size_t cap = SPILL_BATCH;
    spill_raw_t *raws = cm_calloc(&kvs_persist_tag, cap, sizeof(*raws));
    kvs_spill_wreq_t *w = cm_calloc(&kvs_persist_tag, cap, sizeof(*w));
    spill_move_t *mv = cm_calloc(&kvs_persist_tag, cap, sizeof(*mv));
    uint8_t *images = cm_malloc_aligned(&kvs_persist_tag, cap * sp->cfg.max_record_bytes, 4096);
    ri_status_t st = RI_ERR_NOMEM;
    if (raws == NULL || w == NULL || mv == NULL || images == NULL)
        goto out_free;
    st = RI_OK;
    for (uint32_t base = 0; base < sp->n_ents_cap;) {
        size_t n = 0;
        pthread_mutex_lock(&sp->mu);
        for (; base < sp->n_ents_cap && n < cap; base++) {
            const spill_ent_t *e = &sp->ents[base];
            if (!e->used || e->seg != victim)
                continue;
            spill_raw_lookup_locked(sp, &e->key, &raws[n]);
            raws[n].image = images + n * sp->cfg.max_record_bytes;
            n++;
        }
        pthread_mutex_unlock(&sp->mu);
        if (n == 0)
            continue;
        spill_read_raw(sp, raws, n);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (raws[i].status != RI_OK)
                continue;   /* lost (marked) or unreadable: left for the next round */
            const kvs_spill_hdr_t *h = &raws[i].hdr;
            w[k] = (kvs_spill_wreq_t){
                .key = {h->session, h->layer, h->head, h->cluster},
                .dtype = h->dtype,
                .tokens = h->tokens,
                .payload = raws[i].image + KVS_SPILL_HDR_BYTES,
                .payload_bytes = h->payload_bytes,
            };
            mv[k] = (spill_move_t){.seq = h->seq, .old_seg = victim, .old_off = raws[i].off};
            k++;
        }
        ri_status_t ws = spill_write_internal(sp, w, k, mv);
        if (ws != RI_OK && st == RI_OK)
            st = ws;
    }
out_free:
    cm_free(images);
    cm_free(mv);
    cm_free(w);
    cm_free(raws);
    return st;
}

/* Take every empty, inactive segment off the list (mu held); returns them
 * with a ref held, in out[] (capacity n_segs). */
static size_t detach_empty(kvs_spill_t *sp, spill_seg_t **out)
{
    size_t n = 0, keep = 0;
    for (size_t i = 0; i < sp->n_segs; i++) {
        spill_seg_t *s = sp->segs[i];
        if (!s->active && s->live_bytes == 0) {
            s->dead = true;
            s->refs++;
            sp->used_bytes -= s->append;
            sp->st.compactions++;
            sp->st.compacted_bytes += s->file_bytes;
            out[n++] = s;
        } else {
            sp->segs[keep++] = s;
        }
    }
    sp->n_segs = keep;
    return n;
}

ri_status_t kvs_spill_compact(kvs_spill_t *sp, uint64_t *reclaimed_p)
{
    if (sp == NULL)
        return RI_ERR_INVALID;
    ri_status_t st = RI_OK;
    uint64_t reclaimed = 0;
    char path[4200];
    pthread_mutex_lock(&sp->compact_mu);
    for (int round = 0; round < 64; round++) {
        /* Pick the deadest inactive segment past the ratio, if any. */
        pthread_mutex_lock(&sp->mu);
        spill_seg_t *victim = NULL;
        double worst = sp->cfg.compact_dead_ratio;
        bool any_empty = false;
        for (size_t i = 0; i < sp->n_segs; i++) {
            spill_seg_t *s = sp->segs[i];
            if (s->active)
                continue;
            if (s->live_bytes == 0) {
                any_empty = true;
                continue;
            }
            double dead = s->append ? 1.0 - (double)s->live_bytes / (double)s->append : 0.0;
            if (dead >= worst) {
                worst = dead;
                victim = s;
            }
        }
        if (victim != NULL)
            victim->refs++;
        pthread_mutex_unlock(&sp->mu);
        if (victim == NULL && !any_empty)
            break;
        if (victim != NULL) {
            ri_status_t ms = move_live(sp, victim);
            pthread_mutex_lock(&sp->mu);
            bool moved = victim->live_bytes == 0;
            spill_seg_unref(sp, victim);
            pthread_mutex_unlock(&sp->mu);
            if (!moved) {
                st = ms != RI_OK ? ms : RI_ERR_IO;
                cm_warn("spill: compaction of a segment left live records behind (%s); retrying later",
                        ri_status_str(st));
                if (!any_empty)
                    break;
            }
        }
        pthread_mutex_lock(&sp->mu);
        spill_seg_t **gone = cm_calloc(&kvs_persist_tag, sp->n_segs ? sp->n_segs : 1, sizeof(*gone));
        size_t n_gone = gone ? detach_empty(sp, gone) : 0;
        pthread_mutex_unlock(&sp->mu);
        if (gone == NULL) {
            st = RI_ERR_NOMEM;
            break;
        }
        /* Unlink only once a manifest without these segments is durable. */
        ri_status_t cs = n_gone ? spill_checkpoint(sp) : RI_OK;
        for (size_t i = 0; i < n_gone; i++) {
            if (cs == RI_OK) {
                spill_seg_path(sp, gone[i]->id, path, sizeof(path));
                sp->ops->unlink(sp->ops->arg, path);
                reclaimed += gone[i]->file_bytes;
            }
            pthread_mutex_lock(&sp->mu);
            spill_seg_unref(sp, gone[i]);
            pthread_mutex_unlock(&sp->mu);
        }
        cm_free(gone);
        if (cs != RI_OK) {
            st = cs;
            break;
        }
        if (victim == NULL)
            break;
    }
    pthread_mutex_unlock(&sp->compact_mu);
    if (reclaimed_p != NULL)
        *reclaimed_p = reclaimed;
    return st;
}

static void *compactor_main(void *arg)
{
    kvs_spill_t *sp = arg;
    pthread_mutex_lock(&sp->mu);
    while (!sp->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)sp->cfg.compact_interval_ms * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&sp->compact_cv, &sp->mu, &ts);
        if (sp->stopping)
            break;
        pthread_mutex_unlock(&sp->mu);
        (void)kvs_spill_compact(sp, NULL);
        pthread_mutex_lock(&sp->mu);
    }
    pthread_mutex_unlock(&sp->mu);
    return NULL;
}

ri_status_t spill_compactor_start(kvs_spill_t *sp)
{
    if (sp->cfg.compact_interval_ms == 0)
        return RI_OK;
    int rc = pthread_create(&sp->compact_thread, NULL, compactor_main, sp);
    if (rc != 0) {
        cm_error("spill: starting the compaction thread: %s", strerror(rc));
        return cm_status_from_errno(rc);
    }
    sp->compact_running = true;
    return RI_OK;
}

void spill_compactor_stop(kvs_spill_t *sp)
{
    if (!sp->compact_running)
        return;
    pthread_mutex_lock(&sp->mu);
    sp->stopping = true;
    pthread_cond_signal(&sp->compact_cv);
    pthread_mutex_unlock(&sp->mu);
    pthread_join(sp->compact_thread, NULL);
    sp->compact_running = false;
}
