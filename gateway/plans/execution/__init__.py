"""Running a plan task: the driver, the executor, one step, answers, retries, approval."""
