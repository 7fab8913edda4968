/*
 * aml/utils/async.h - AML's task scheduler (libaml on ferry; included by aml.h). A task is a
 * function and its in/out pointers; a scheduler runs tasks submitted to it. The generic calls
 * dispatch through sched->ops (a program's own scheduler works too). The queue scheduler: a
 * work queue served by nt threads (0: the waiting caller runs the tasks); destroy runs the
 * tasks still queued on the caller, as AML's. Unlike AML's, waiting for a task not pending
 * (never submitted, or already waited for) returns -AML_EDOM instead of blocking forever.
 */
#ifndef AML_ASYNC_H
#define AML_ASYNC_H

#ifdef __cplusplus
extern "C" {
#endif

struct aml_task_in;
struct aml_task_out;
struct aml_task_data;

typedef void (*aml_task_work)(struct aml_task_in *, struct aml_task_out *);

struct aml_task {
	struct aml_task_in *in;
	struct aml_task_out *out;
	aml_task_work fn; /* non-NULL */
	void *data;       /* the caller's */
};

struct aml_sched_data;

struct aml_sched_ops {
	int (*submit)(struct aml_sched_data *data, struct aml_task *task);
	int (*wait)(struct aml_sched_data *data, struct aml_task *task);
	/* a finished task; NULL when none is pending */
	struct aml_task *(*wait_any)(struct aml_sched_data *data);
};

struct aml_sched {
	struct aml_sched_data *data;
	struct aml_sched_ops *ops;
};

/* -AML_EINVAL: NULL pool, data or ops; else the scheduler's value (queue scheduler:
 * -AML_EINVAL for a NULL task or function). */
int aml_sched_submit_task(struct aml_sched *pool, struct aml_task *task);
/* -AML_EINVAL: NULL pool, data or ops; queue scheduler: -AML_EDOM if the task is not pending. */
int aml_sched_wait_task(struct aml_sched *pool, struct aml_task *task);
/* A finished task (waiting while some are pending); NULL when none is pending. */
struct aml_task *aml_sched_wait_any(struct aml_sched *pool);

/* NULL with aml_errno (AML_FAILURE) if a thread cannot be started. */
struct aml_sched *aml_queue_sched_create(const size_t nt);
/* Runs the tasks still queued, frees the scheduler, sets *sched to NULL; NULL: no-op. */
void aml_queue_sched_destroy(struct aml_sched **sched);

int aml_queue_sched_submit(struct aml_sched_data *data, struct aml_task *task);
int aml_queue_sched_wait(struct aml_sched_data *data, struct aml_task *task);
int aml_queue_sched_wait_async(struct aml_sched_data *data, struct aml_task *task);
struct aml_task *aml_queue_sched_wait_any(struct aml_sched_data *data);
struct aml_task *aml_queue_sched_wait_any_async(struct aml_sched_data *data);

#ifdef __cplusplus
}
#endif

#endif
