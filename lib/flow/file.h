/* File I/O that never leaves a half-written artifact under its final name:
 * writes go to "<name>.tmp.<pid>" in the same directory, which is fsynced,
 * renamed into place and its directory fsynced on commit, and unlinked on
 * abort.  Also whole-file and whole-stream reads with errors that name
 * them. */
#ifndef FLOW_FILE_H
#define FLOW_FILE_H

#include <stdio.h>

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_atomic_file flow_atomic_file_t;

/* Open a temporary file beside path for writing (mode 0644 before umask).
 * Free with flow_atomic_file_commit() or flow_atomic_file_abort(). */
FLOW_EXPORT flow_err_t flow_atomic_file_open(const char *path,
					     flow_atomic_file_t **file_out,
					     flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* The stdio stream to write through; borrowed until commit or abort. */
FLOW_EXPORT FILE *flow_atomic_file_stream(flow_atomic_file_t *file);
/* Name of the temporary file; borrowed until commit or abort. */
FLOW_EXPORT const char *flow_atomic_file_temp_path(
	const flow_atomic_file_t *file);
/* Write len bytes. */
FLOW_EXPORT flow_err_t flow_atomic_file_write(flow_atomic_file_t *file,
					      const void *data, size_t len,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Flush, fsync, rename onto the final name, fsync the directory, free.  On
 * failure the temporary is removed, the final name untouched, file freed. */
FLOW_EXPORT flow_err_t flow_atomic_file_commit(flow_atomic_file_t *file,
					       flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Remove the temporary and free; NULL is ignored. */
FLOW_EXPORT void flow_atomic_file_abort(flow_atomic_file_t *file);

/* Write a whole buffer atomically to path. */
FLOW_EXPORT flow_err_t flow_file_write_atomic(const char *path,
					      const void *data, size_t len,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* The longest text file flow reads whole (plans, manifests, checkpoint
 * indexes): 1 GiB, far beyond any real one (a checkpoint manifest of
 * 4096 ranks holding 1000 tensors each is about 600 MiB), so that a file
 * or a pipe cannot make a reader allocate without bound. */
#define FLOW_TEXT_FILE_MAX ((size_t)1 << 30)

/* Read a whole regular file of at most FLOW_TEXT_FILE_MAX bytes
 * (FLOW_ERR_RANGE naming it otherwise).  *data_out is NUL-terminated (not
 * counted in *len_out) and owned by the caller: free with free(). */
FLOW_EXPORT flow_err_t flow_file_read_all(const char *path, char **data_out,
					  size_t *len_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Read stream f to its end (standard input, a pipe), naming it `name`
 * in messages ("standard input: out of memory", "cannot read standard
 * input"); FLOW_ERR_RANGE past FLOW_TEXT_FILE_MAX bytes.  *data_out is owned by the caller (free with free()); it is
 * NUL-terminated, the NUL not counted in *len_out.  Both are set only on
 * FLOW_OK. */
FLOW_EXPORT flow_err_t flow_file_read_stream(FILE *f, const char *name,
					     char **data_out, size_t *len_out,
					     flow_diag_t *diag) FLOW_MUST_CHECK;
/* fsync the directory holding path (or path itself when it is one). */
/* pread up to len bytes at offset off into buf, retrying short reads and
 * EINTR: *got holds the bytes read (fewer than len only at the end of the
 * file).  Returns 0, or the errno of a failed read; the callers word the
 * error, naming what they read. */
FLOW_EXPORT int flow_pread_full(int fd, void *buf, size_t len, uint64_t off,
				size_t *got);

FLOW_EXPORT flow_err_t flow_fsync_dir(const char *path, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* A directory built under a temporary name and renamed into place as a
 * whole: "<path>.tmp.<pid>" beside path.  The caller creates, writes and
 * fsyncs files inside it (e.g. with flow_atomic_file_*), then commits.
 * The directory must hold plain files only (no subdirectories): abort and
 * the signal cleanup remove every entry they find in it with one
 * getdents64 scan, so no list of names has to be kept and any number of
 * files is covered. */
typedef struct flow_temp_dir flow_temp_dir_t;

/* Create "<path>.tmp.<pid>" (mode 0755 before umask).  Fails with
 * FLOW_ERR_IO when path already exists (nothing is created then).  Free
 * with flow_temp_dir_commit() or flow_temp_dir_abort(). */
FLOW_EXPORT flow_err_t flow_temp_dir_create(const char *path,
					    flow_temp_dir_t **dir_out,
					    flow_diag_t *diag) FLOW_MUST_CHECK;
/* Name of the temporary directory; borrowed until commit or abort. */
FLOW_EXPORT const char *flow_temp_dir_path(const flow_temp_dir_t *dir);
/* fsync the temporary directory, rename it to the final path (never over
 * an existing one: FLOW_ERR_IO), fsync the parent directory, free.  On
 * failure the temporary directory is removed, the final name untouched
 * and dir freed. */
FLOW_EXPORT flow_err_t flow_temp_dir_commit(flow_temp_dir_t *dir,
					    flow_diag_t *diag) FLOW_MUST_CHECK;
/* Remove the temporary directory and its files and free; NULL is
 * ignored. */
FLOW_EXPORT void flow_temp_dir_abort(flow_temp_dir_t *dir);

/* Temporaries of every open atomic file and every uncommitted temporary
 * directory (with its files) are removed by flow_atomic_file_cleanup_all(),
 * which is async-signal-safe (open, getdents64, unlinkat, rmdir, close):
 * a tool's SIGINT/SIGTERM handler calls it and then re-raises the
 * signal. */
FLOW_EXPORT void flow_atomic_file_cleanup_all(void);

#ifdef __cplusplus
}
#endif

#endif
