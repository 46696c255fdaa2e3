/* Atomic artifact writes (temp name, fsync, rename, fsync dir) and whole-file
 * reads.  Open temporaries are registered so a signal handler can remove
 * them without touching any final name. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <flow/file.h>

/* Temporaries that a signal handler may have to remove.  Fixed slots so the
 * handler needs no allocation and no lock. */
#define TEMP_SLOTS 64
static char temp_paths[TEMP_SLOTS][PATH_MAX];
static volatile sig_atomic_t temp_used[TEMP_SLOTS];
static pthread_mutex_t temp_lock = PTHREAD_MUTEX_INITIALIZER;

struct flow_atomic_file {
	FILE *stream;
	char *final_path;
	char *temp_path;
	int slot; /* index in temp_paths, or -1 when not registered */
};

static int temp_register(const char *path)
{
	int slot = -1;
	if (strlen(path) >= PATH_MAX)
		return -1;
	pthread_mutex_lock(&temp_lock);
	for (int i = 0; i < TEMP_SLOTS; i++) {
		if (!temp_used[i]) {
			memcpy(temp_paths[i], path, strlen(path) + 1);
			temp_used[i] = 1;
			slot = i;
			break;
		}
	}
	pthread_mutex_unlock(&temp_lock);
	return slot;
}

static void temp_unregister(int slot)
{
	if (slot < 0)
		return;
	pthread_mutex_lock(&temp_lock);
	temp_used[slot] = 0;
	pthread_mutex_unlock(&temp_lock);
}

/* Temporary directories, in fixed slots for the same reason.  Their files
 * are not listed: removal scans the directory with the getdents64 system
 * call (readdir may allocate, so it is not async-signal-safe), which covers
 * any number of files without a registry of names. */
#define TEMP_DIR_SLOTS 8
static char temp_dir_paths[TEMP_DIR_SLOTS][PATH_MAX];
static volatile sig_atomic_t temp_dir_used[TEMP_DIR_SLOTS];

/* Unlink every entry of directory path and remove it.  Async-signal-safe:
 * only system calls and the caller's buffer.  Unlinking while scanning may
 * make a file system skip entries, so scans repeat until one finds
 * nothing (a few passes at most). */
static void remove_dir_tree_flat(const char *path, char *buf, size_t cap)
{
	for (int pass = 0; pass < 16; pass++) {
		int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0)
			break;
		int removed = 0;
		for (;;) {
			long n = syscall(SYS_getdents64, fd, buf, cap);
			if (n <= 0)
				break;
			for (long at = 0; at < n;) {
				/* struct linux_dirent64: u64 ino, s64 off,
				 * u16 reclen, u8 type, char name[]. */
				unsigned short reclen;
				memcpy(&reclen, buf + at + 16, sizeof(reclen));
				const char *name = buf + at + 19;
				if (!(name[0] == '.' &&
				      (name[1] == '\0' ||
				       (name[1] == '.' && name[2] == '\0')))) {
					if (unlinkat(fd, name, 0) == 0)
						removed++;
				}
				at += reclen;
			}
		}
		close(fd);
		if (!removed)
			break;
	}
	rmdir(path);
}

void flow_atomic_file_cleanup_all(void)
{
	static char buf[8192];
	for (int i = 0; i < TEMP_SLOTS; i++)
		if (temp_used[i])
			unlink(temp_paths[i]);
	for (int i = 0; i < TEMP_DIR_SLOTS; i++)
		if (temp_dir_used[i])
			remove_dir_tree_flat(temp_dir_paths[i], buf, sizeof(buf));
}

struct flow_temp_dir {
	char *final_path;
	char *temp_path;
	int slot; /* index in temp_dir_paths, or -1 when not registered */
};

static int temp_dir_register(const char *path)
{
	int slot = -1;
	if (strlen(path) >= PATH_MAX)
		return -1;
	pthread_mutex_lock(&temp_lock);
	for (int i = 0; i < TEMP_DIR_SLOTS; i++) {
		if (!temp_dir_used[i]) {
			memcpy(temp_dir_paths[i], path, strlen(path) + 1);
			temp_dir_used[i] = 1;
			slot = i;
			break;
		}
	}
	pthread_mutex_unlock(&temp_lock);
	return slot;
}

static void temp_dir_destroy(flow_temp_dir_t *dir)
{
	if (dir->slot >= 0) {
		pthread_mutex_lock(&temp_lock);
		temp_dir_used[dir->slot] = 0;
		pthread_mutex_unlock(&temp_lock);
	}
	free(dir->temp_path);
	free(dir->final_path);
	free(dir);
}

static char *dup_printf(const char *fmt, const char *a, long b)
{
	int n = snprintf(NULL, 0, fmt, a, b);
	if (n < 0)
		return NULL;
	char *s = malloc((size_t)n + 1);
	if (s)
		snprintf(s, (size_t)n + 1, fmt, a, b);
	return s;
}

flow_err_t flow_atomic_file_open(const char *path,
				 flow_atomic_file_t **file_out,
				 flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	flow_atomic_file_t *file = calloc(1, sizeof(*file));
	if (!file)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory opening it for writing", path);
	file->slot = -1;
	file->final_path = strdup(path);
	file->temp_path = dup_printf("%s.tmp.%ld", path, (long)getpid());
	if (!file->final_path || !file->temp_path) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory opening it for writing", path);
		goto out_free;
	}
	file->slot = temp_register(file->temp_path);
	int fd = open(file->temp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
		      0644);
	if (fd < 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot create '%s'", file->temp_path);
		goto out_unregister;
	}
	file->stream = fdopen(fd, "wb");
	if (!file->stream) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot open '%s'", file->temp_path);
		close(fd);
		goto out_unlink;
	}
	*file_out = file;
	return FLOW_OK;

out_unlink:
	unlink(file->temp_path);
out_unregister:
	temp_unregister(file->slot);
out_free:
	free(file->temp_path);
	free(file->final_path);
	free(file);
	return err;
}

FILE *flow_atomic_file_stream(flow_atomic_file_t *file)
{
	return file->stream;
}

const char *flow_atomic_file_temp_path(const flow_atomic_file_t *file)
{
	return file->temp_path;
}

flow_err_t flow_atomic_file_write(flow_atomic_file_t *file, const void *data,
				  size_t len, flow_diag_t *diag)
{
	if (len && fwrite(data, 1, len, file->stream) != len)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot write '%s'", file->temp_path);
	return FLOW_OK;
}

static void atomic_file_destroy(flow_atomic_file_t *file)
{
	temp_unregister(file->slot);
	free(file->temp_path);
	free(file->final_path);
	free(file);
}

flow_err_t flow_atomic_file_commit(flow_atomic_file_t *file,
				   flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	FILE *stream = file->stream;
	file->stream = NULL;
	if (fflush(stream) != 0 || ferror(stream)) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot write '%s'", file->temp_path);
		fclose(stream);
		goto out_unlink;
	}
	if (fsync(fileno(stream)) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot sync '%s'", file->temp_path);
		fclose(stream);
		goto out_unlink;
	}
	if (fclose(stream) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot close '%s'", file->temp_path);
		goto out_unlink;
	}
	if (rename(file->temp_path, file->final_path) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot rename '%s' to '%s'",
				      file->temp_path, file->final_path);
		goto out_unlink;
	}
	/* The rename is durable only once the directory entry is. */
	err = flow_fsync_dir(file->final_path, diag);
	atomic_file_destroy(file);
	return err;

out_unlink:
	unlink(file->temp_path);
	atomic_file_destroy(file);
	return err;
}

void flow_atomic_file_abort(flow_atomic_file_t *file)
{
	if (!file)
		return;
	if (file->stream)
		fclose(file->stream);
	unlink(file->temp_path);
	atomic_file_destroy(file);
}

flow_err_t flow_file_write_atomic(const char *path, const void *data,
				  size_t len, flow_diag_t *diag)
{
	flow_atomic_file_t *file;
	flow_err_t err = flow_atomic_file_open(path, &file, diag);
	if (err != FLOW_OK)
		return err;
	err = flow_atomic_file_write(file, data, len, diag);
	if (err != FLOW_OK) {
		flow_atomic_file_abort(file);
		return err;
	}
	return flow_atomic_file_commit(file, diag);
}

int flow_pread_full(int fd, void *buf, size_t len, uint64_t off, size_t *got)
{
	*got = 0;
	while (*got < len) {
		ssize_t n = pread(fd, (char *)buf + *got, len - *got,
				  (off_t)(off + *got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		if (n == 0)
			break;
		*got += (size_t)n;
	}
	return 0;
}

flow_err_t flow_fsync_dir(const char *path, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	struct stat st;
	char *dir = NULL;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		dir = strdup(path);
	} else {
		const char *slash = strrchr(path, '/');
		if (!slash)
			dir = strdup(".");
		else if (slash == path)
			dir = strdup("/");
		else
			dir = strndup(path, (size_t)(slash - path));
	}
	if (!dir)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming its directory", path);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot open directory '%s'", dir);
		goto out_free;
	}
	/* Some file systems cannot sync a directory; that is not a failure. */
	if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot sync directory '%s'", dir);
	close(fd);
out_free:
	free(dir);
	return err;
}

flow_err_t flow_file_read_all(const char *path, char **data_out,
			      size_t *len_out, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	char *data = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot open '%s'", path);
	struct stat st;
	if (fstat(fd, &st) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot stat '%s'", path);
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		err = flow_diag_set(diag, FLOW_ERR_IO,
				    "cannot read '%s': not a regular file",
				    path);
		goto out_close;
	}
	if ((uint64_t)st.st_size > FLOW_TEXT_FILE_MAX) {
		err = flow_diag_set(diag, FLOW_ERR_RANGE,
				    "%s: %lld bytes is more than a text file may hold (%zu)",
				    path, (long long)st.st_size, FLOW_TEXT_FILE_MAX);
		goto out_close;
	}
	size_t len = (size_t)st.st_size, cap;
	if (!flow_add_size(len, 1, &cap) || !(data = malloc(cap))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "%s: out of memory for its %zu bytes", path,
				    len);
		goto out_close;
	}
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, data + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
					      "cannot read '%s'", path);
			goto out_free;
		}
		if (n == 0) {
			err = flow_diag_set(diag, FLOW_ERR_IO,
					    "cannot read '%s': file shrank while reading",
					    path);
			goto out_free;
		}
		got += (size_t)n;
	}
	data[len] = '\0';
	*data_out = data;
	*len_out = len;
	close(fd);
	return FLOW_OK;

out_free:
	free(data);
out_close:
	close(fd);
	return err;
}

flow_err_t flow_file_read_stream(FILE *f, const char *name, char **data_out,
			       size_t *len_out, flow_diag_t *diag)
{
	size_t len = 0, cap = 0;
	char *data = NULL;

	for (;;) {
		/* One byte more than read, for the NUL. */
		if (len + 1 >= cap) {
			size_t ncap;
			char *p;
			if (len > FLOW_TEXT_FILE_MAX) {
				free(data);
				return flow_diag_set(diag, FLOW_ERR_RANGE,
						     "%s: more than a text file may hold (%zu bytes)",
						     name, FLOW_TEXT_FILE_MAX);
			}
			if (!flow_mul_size(cap ? cap : 32768, 2, &ncap) ||
			    !(p = realloc(data, ncap))) {
				free(data);
				return flow_diag_set(diag, FLOW_ERR_NOMEM,
						     "%s: out of memory growing past %zu bytes",
						     name, cap);
			}
			data = p;
			cap = ncap;
		}
		size_t n = fread(data + len, 1, cap - 1 - len, f);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(f)) {
		free(data);
		return flow_diag_set(diag, FLOW_ERR_IO, "cannot read %s", name);
	}
	data[len] = '\0';
	*data_out = data;
	*len_out = len;
	return FLOW_OK;
}

flow_err_t flow_temp_dir_create(const char *path, flow_temp_dir_t **dir_out,
				flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	struct stat st;
	if (lstat(path, &st) == 0)
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "output directory '%s' already exists",
				     path);
	flow_temp_dir_t *dir = calloc(1, sizeof(*dir));
	if (!dir)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory creating it", path);
	dir->slot = -1;
	dir->final_path = strdup(path);
	/* "data/" names "data": the temporary goes beside it, not inside. */
	for (size_t n = dir->final_path ? strlen(dir->final_path) : 0;
	     n > 1 && dir->final_path[n - 1] == '/'; n--)
		dir->final_path[n - 1] = '\0';
	if (dir->final_path)
		dir->temp_path = dup_printf("%s.tmp.%ld", dir->final_path,
					    (long)getpid());
	if (!dir->final_path || !dir->temp_path) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory creating it", path);
		goto out_free;
	}
	if (strlen(dir->temp_path) >= PATH_MAX) {
		/* Unregistered, a signal could not remove it: refuse. */
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "path '%s' is too long", path);
		goto out_free;
	}
	/* Register before creating, so no instant exists in which a signal
	 * would leave the directory behind. */
	dir->slot = temp_dir_register(dir->temp_path);
	if (dir->slot < 0) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "too many temporary directories open (at most %d)",
				    TEMP_DIR_SLOTS);
		goto out_free;
	}
	if (mkdir(dir->temp_path, 0755) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot create directory '%s'",
				      dir->temp_path);
		goto out_free;
	}
	*dir_out = dir;
	return FLOW_OK;

out_free:
	temp_dir_destroy(dir);
	return err;
}

const char *flow_temp_dir_path(const flow_temp_dir_t *dir)
{
	return dir->temp_path;
}

void flow_temp_dir_abort(flow_temp_dir_t *dir)
{
	char buf[8192];
	if (!dir)
		return;
	remove_dir_tree_flat(dir->temp_path, buf, sizeof(buf));
	temp_dir_destroy(dir);
}

/* rename that fails with EEXIST instead of replacing an empty directory. */
static int rename_noreplace(const char *from, const char *to)
{
#ifdef RENAME_NOREPLACE
	if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -1;
#endif
	/* The file system cannot refuse for us: check, then rename. */
	struct stat st;
	if (lstat(to, &st) == 0) {
		errno = EEXIST;
		return -1;
	}
	return rename(from, to);
}

flow_err_t flow_temp_dir_commit(flow_temp_dir_t *dir, flow_diag_t *diag)
{
	flow_err_t err = flow_fsync_dir(dir->temp_path, diag);
	if (err != FLOW_OK)
		goto out_abort;
	if (rename_noreplace(dir->temp_path, dir->final_path) != 0) {
		if (errno == EEXIST || errno == ENOTEMPTY)
			err = flow_diag_set(diag, FLOW_ERR_IO,
					    "output directory '%s' already exists",
					    dir->final_path);
		else
			err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
					      "cannot rename '%s' to '%s'",
					      dir->temp_path, dir->final_path);
		goto out_abort;
	}
	/* Durable once the parent's entry is: sync the directory holding the
	 * final name (flow_fsync_dir on a directory syncs that directory). */
	const char *slash = strrchr(dir->final_path, '/');
	char *parent = !slash ? strdup(".") :
		       slash == dir->final_path ? strdup("/") :
		       strndup(dir->final_path,
			       (size_t)(slash - dir->final_path));
	if (!parent) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming its parent", dir->final_path);
	} else {
		err = flow_fsync_dir(parent, diag);
		free(parent);
	}
	temp_dir_destroy(dir);
	return err;

out_abort:
	flow_temp_dir_abort(dir);
	return err;
}
