/*
 * test_sched.c - AML's task scheduler (aml/utils/async.h) on libaml: the queue scheduler with
 * threads and without (the caller runs the tasks), waiting for one task and for any, tasks not
 * pending, destroy running what is still queued, a program's own scheduler through the
 * generic calls, the features header, and AML's task form of a Linux DMA request
 * (aml_dma_linux_exec_request run by a queue scheduler). Common subset of C and C++; prints
 * "test_sched: OK"; exits 1 at the first failed check.
 */
#include <aml.h>
#include <aml/dma/linux.h>
#include <stdint.h>
#include <string.h>

#define CHECK(c)                                                                         \
	do {                                                                                 \
		if (!(c)) {                                                                      \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);      \
			exit(1);                                                                     \
		}                                                                                \
	} while (0)

struct aml_task_in {
	long v;
};
struct aml_task_out {
	long v;
};

#define N 100

static void twice(struct aml_task_in *in, struct aml_task_out *out)
{
	long spin = 0;
	for (long i = 0; i < 1000 * (in->v % 7); i++)
		spin += i ^ spin;
	out->v = 2 * in->v + (spin & 0);
}

static void make(struct aml_task *t, struct aml_task_in *in, struct aml_task_out *out, long i)
{
	in->v = i;
	out->v = -1;
	t->in = in;
	t->out = out;
	t->fn = twice;
	t->data = NULL;
}

static void test_queue(size_t nt)
{
	static struct aml_task tasks[N], never;
	static struct aml_task_in in[N];
	static struct aml_task_out out[N];
	static int seen[N];
	struct aml_task *t;
	struct aml_sched *s = aml_queue_sched_create(nt);

	CHECK(s != NULL && s->data != NULL && s->ops != NULL);
	for (long i = 0; i < N; i++) {
		make(tasks + i, in + i, out + i, i);
		seen[i] = 0;
	}
	/* One task, then any. */
	CHECK(aml_sched_submit_task(s, tasks) == AML_SUCCESS);
	CHECK(aml_sched_wait_any(s) == tasks && out[0].v == 0);
	CHECK(aml_sched_wait_any(s) == NULL);
	/* All, one waited for by name, the rest by wait_any. */
	for (int i = 0; i < N; i++)
		CHECK(aml_sched_submit_task(s, tasks + i) == AML_SUCCESS);
	CHECK(aml_sched_wait_task(s, tasks + N / 2) == AML_SUCCESS && out[N / 2].v == N);
	seen[N / 2] = 1;
	CHECK(aml_sched_wait_task(s, tasks + N / 2) == -AML_EDOM); /* already waited for */
	for (int i = 0; i < N - 1; i++) {
		t = aml_sched_wait_any(s);
		CHECK(t != NULL && t >= tasks && t < tasks + N);
		CHECK(!seen[t - tasks]);
		seen[t - tasks] = 1;
		CHECK(out[t - tasks].v == 2 * (t - tasks));
	}
	CHECK(aml_sched_wait_any(s) == NULL);
	/* Not pending, NULL, without a function. */
	make(&never, in, out, 0);
	CHECK(aml_sched_wait_task(s, &never) == -AML_EDOM);
	CHECK(aml_sched_submit_task(s, NULL) == -AML_EINVAL);
	never.fn = NULL;
	CHECK(aml_sched_submit_task(s, &never) == -AML_EINVAL);
	/* Destroy runs what is still queued (all done once it returns). */
	for (int i = 0; i < 10; i++) {
		out[i].v = -1;
		CHECK(aml_sched_submit_task(s, tasks + i) == AML_SUCCESS);
	}
	aml_queue_sched_destroy(&s);
	CHECK(s == NULL);
	for (int i = 0; i < 10; i++)
		CHECK(out[i].v == 2 * i);
	aml_queue_sched_destroy(&s);
	aml_queue_sched_destroy(NULL);
}

/* A program's own scheduler: runs each task at submission. */
static struct aml_task *last;
static int own_submit(struct aml_sched_data *d, struct aml_task *t)
{
	(void)d;
	t->fn(t->in, t->out);
	last = t;
	return AML_SUCCESS;
}
static int own_wait(struct aml_sched_data *d, struct aml_task *t)
{
	(void)d;
	return t == last ? AML_SUCCESS : -AML_EDOM;
}
static struct aml_task *own_wait_any(struct aml_sched_data *d)
{
	struct aml_task *t = last;
	(void)d;
	last = NULL;
	return t;
}

static void test_own(void)
{
	struct aml_sched_ops ops;
	struct aml_sched s;
	struct aml_task t;
	struct aml_task_in in;
	struct aml_task_out out;
	int token = 0;

	ops.submit = own_submit;
	ops.wait = own_wait;
	ops.wait_any = own_wait_any;
	s.data = (struct aml_sched_data *)&token;
	s.ops = &ops;
	make(&t, &in, &out, 21);
	CHECK(aml_sched_submit_task(&s, &t) == AML_SUCCESS && out.v == 42);
	CHECK(aml_sched_wait_task(&s, &t) == AML_SUCCESS);
	CHECK(aml_sched_wait_any(&s) == &t && aml_sched_wait_any(&s) == NULL);
	ops.wait = NULL;
	CHECK(aml_sched_wait_task(&s, &t) == -AML_EINVAL);
	s.data = NULL;
	CHECK(aml_sched_submit_task(&s, &t) == -AML_EINVAL);
	CHECK(aml_sched_submit_task(NULL, &t) == -AML_EINVAL);
	CHECK(aml_sched_wait_any(NULL) == NULL && aml_errno == AML_EINVAL);
}

/* AML's task form of a Linux DMA request (struct aml_dma_linux_request), run by a queue
 * scheduler with aml_dma_linux_exec_request as its work. */
static void test_dma_linux_task(void)
{
	double src[8], dst[8];
	for (int i = 0; i < 8; i++) {
		src[i] = i + 0.5;
		dst[i] = 0;
	}
	struct aml_dma_linux_request r;
	memset(&r, 0, sizeof(r));
	CHECK(pthread_mutex_init(&r.lock, NULL) == 0);
	r.task_in.op = aml_dma_linux_memcpy_op;
	r.task_in.dst = (struct aml_layout *)dst;
	r.task_in.src = (struct aml_layout *)src;
	r.task_in.op_arg = (void *)(uintptr_t)sizeof(src);
	r.task_in.req = &r;
	r.task_out = -1;
	r.task.in = (struct aml_task_in *)&r.task_in;
	r.task.out = (struct aml_task_out *)&r.task_out;
	r.task.fn = aml_dma_linux_exec_request;
	struct aml_sched *s = aml_queue_sched_create(2);
	CHECK(s != NULL);
	CHECK(aml_sched_submit_task(s, &r.task) == AML_SUCCESS);
	CHECK(aml_sched_wait_task(s, &r.task) == AML_SUCCESS);
	CHECK(r.task_out == AML_SUCCESS && (r.flags & AML_DMA_LINUX_REQUEST_FLAGS_DONE));
	CHECK(memcmp(dst, src, sizeof(src)) == 0);
	/* No operator: -AML_EINVAL in the output, the request untouched. */
	r.task_in.op = NULL;
	r.flags = 0;
	aml_dma_linux_exec_request(r.task.in, r.task.out);
	CHECK(r.task_out == -AML_EINVAL && r.flags == 0);
	aml_queue_sched_destroy(&s);
	CHECK(pthread_mutex_destroy(&r.lock) == 0);
}

int main(void)
{
	CHECK(AML_HAVE_BACKEND_LIBNUMA == 1 && AML_BACKEND_HIP == (1UL << 6));
	CHECK(aml_support_backends(AML_BACKEND_LIBNUMA) == 1);
	test_queue(4);
	test_queue(1);
	test_queue(0);
	test_own();
	test_dma_linux_task();
	printf("test_sched: OK\n");
	return 0;
}
