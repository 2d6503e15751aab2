--[[
hetsched job_submit plugin (JobSubmitPlugins=lua; install as job_submit.lua
beside slurm.conf). Runs once per job, and once per component of a
heterogeneous job.

1. Tags hetsched's jobs: a job whose --comment is "hetsched:PLAN:JOB:SEG"
   (what hetsched's sbatch templates write) gets admin_comment
   "hetsched plan=PLAN job=JOB segment=SEG", which users cannot change, so
   admins can find every job of a plan with
   `squeue -O JobID,AdminComment` or `scontrol show job`.

2. Rejects a GPU type the partition lacks: `--gres=gpu:h100:1` on a
   partition without h100 fails at submission with a clear message instead
   of pending forever. The GPU types per partition come from
   hetsched_gpu_types.conf beside this script, one line per partition:
       gpu a100 t4 v100
   (`hetsched testbed up --lua` writes it; sites generate it from
   `sinfo -o "%R %G"`). Without that file nothing is rejected.
]]

local TYPES_FILE = "hetsched_gpu_types.conf"

local function script_dir()
   local src = debug.getinfo(1, "S").source or ""
   if string.sub(src, 1, 1) == "@" then
      return string.match(string.sub(src, 2), "^(.*)/[^/]*$") or "."
   end
   return "."
end

-- partition name -> set of GPU types; read on every call so edits apply at once
local function load_types()
   local f = io.open(script_dir() .. "/" .. TYPES_FILE, "r")
   if f == nil then
      return nil
   end
   local map = {}
   for line in f:lines() do
      local fields = {}
      for word in string.gmatch(line, "%S+") do
         table.insert(fields, word)
      end
      if #fields >= 1 and string.sub(fields[1], 1, 1) ~= "#" then
         local set = {}
         for i = 2, #fields do
            set[string.lower(fields[i])] = true
         end
         map[fields[1]] = set
      end
   end
   f:close()
   return map
end

-- GPU types named in any tres_per_* / gres request: "gres:gpu:a100:2" -> {a100}
local function requested_types(job_desc)
   local out = {}
   local fields = { "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket",
                    "gres" }
   for _, name in ipairs(fields) do
      local ok, value = pcall(function() return job_desc[name] end)
      if ok and type(value) == "string" then
         for item in string.gmatch(value, "[^,]+") do
            local t = string.match(item, "gpu[:/]([^:=,]+)")
            if t ~= nil and tonumber(t) == nil then
               out[string.lower(t)] = true
            end
         end
      end
   end
   return out
end

local function default_partition(part_list)
   for name, part in pairs(part_list) do
      if part.flag_default == 1 or part.flag_default == true then
         return part.name or name
      end
   end
   return nil
end

local function sorted_keys(set)
   local keys = {}
   for k, _ in pairs(set) do
      table.insert(keys, k)
   end
   table.sort(keys)
   return table.concat(keys, ", ")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local comment = job_desc.comment
   if comment ~= nil then
      local plan, job, seg = string.match(comment, "^hetsched:([%w._-]+):([%w._-]+):(%d+)$")
      if plan ~= nil then
         job_desc.admin_comment = "hetsched plan=" .. plan .. " job=" .. job ..
            " segment=" .. seg
      end
   end

   local map = load_types()
   if map == nil then
      return slurm.SUCCESS
   end
   local wanted = requested_types(job_desc)
   if next(wanted) == nil then
      return slurm.SUCCESS
   end
   local partition = job_desc.partition or default_partition(part_list)
   if partition == nil then
      return slurm.SUCCESS
   end
   -- a comma-separated partition list: the type must exist in one of them
   for t, _ in pairs(wanted) do
      local found = false
      local known = {}
      for p in string.gmatch(partition, "[^,]+") do
         local types = map[p]
         if types == nil or types[t] then
            found = true
         elseif types ~= nil then
            for k, _ in pairs(types) do known[k] = true end
         end
      end
      if not found then
         slurm.log_user("hetsched: partition %s has no GPU type '%s' (it has: %s)",
                        partition, t, sorted_keys(known))
         return slurm.ERROR
      end
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

slurm.log_info("hetsched job_submit.lua loaded")
return slurm.SUCCESS
