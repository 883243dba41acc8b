-- Placeholder (branch wt-recov only): 0022 is another branch's migration of issue #14;
-- the migrator refuses gaps, so this empty file lets 0023 apply here. Drop it at merge.
SELECT 1;
