/*
 * hetsched SPANK plugin: adds `--hetsched-plan=PLAN_ID` to srun, sbatch and
 * salloc. In the job's tasks it sets HETSCHED_PLAN_ID=PLAN_ID, so a step
 * launched by hand (not by hetsched's templates) can still be attributed to
 * a plan. The value is validated ([A-Za-z0-9._-]+, at most 64 characters):
 * anything else is refused before the job starts.
 *
 * Build:  gcc -shared -fPIC -o spank_hetsched.so spank_hetsched.c
 *         (headers from libslurm-dev: /usr/include/slurm/spank.h)
 * Enable: a line "optional /path/spank_hetsched.so" in plugstack.conf.
 */
#include <string.h>
#include <slurm/spank.h>

SPANK_PLUGIN(hetsched, 1);

#define MAX_PLAN_ID 64

static char plan_id[MAX_PLAN_ID + 1];

static int valid_plan_id(const char *s)
{
	size_t n = 0;

	if (s == NULL || *s == '\0')
		return 0;
	for (; s[n] != '\0'; n++) {
		char c = s[n];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			 (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (!ok || n >= MAX_PLAN_ID)
			return 0;
	}
	return 1;
}

static int opt_plan(int val, const char *optarg, int remote)
{
	(void) val;
	(void) remote;
	if (!valid_plan_id(optarg)) {
		slurm_error("hetsched: --hetsched-plan needs letters, digits, '.', '_' or '-' "
			    "(at most %d), got '%s'", MAX_PLAN_ID, optarg ? optarg : "");
		return ESPANK_BAD_ARG;
	}
	strncpy(plan_id, optarg, MAX_PLAN_ID);
	plan_id[MAX_PLAN_ID] = '\0';
	return ESPANK_SUCCESS;
}

static struct spank_option plan_option = {
	"hetsched-plan", "PLAN_ID",
	"Tag this job with a hetsched plan id (sets HETSCHED_PLAN_ID in its tasks).",
	1, 0, (spank_opt_cb_f) opt_plan
};

/*
 * Register the option from slurm_spank_init rather than a static
 * spank_options table: sbatch (allocator context) only offers options that
 * are registered this way.
 */
int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return spank_option_register(sp, &plan_option);
}

/* remote (slurmstepd) side: the option was forwarded; export it to the tasks */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (!spank_remote(sp) || plan_id[0] == '\0')
		return ESPANK_SUCCESS;
	if (spank_setenv(sp, "HETSCHED_PLAN_ID", plan_id, 1) != ESPANK_SUCCESS) {
		slurm_error("hetsched: cannot set HETSCHED_PLAN_ID");
		return ESPANK_ERROR;
	}
	return ESPANK_SUCCESS;
}
