-- `bench first-batch`: the steps of manifest_seed.sql that differ (same labels replace them).
-- Every seeded clip row reuses the bytes of a real clip: clip i is real slot i %% %(slots)s,
-- slots laid out shard by shard (%(per_shard)s a shard), so the rows reference real shards in
-- the object store at real byte ranges and decode to the frame counts they carry.

-- step: shards
INSERT INTO shards (shard_key, index_key, sha256, size_bytes, clip_count, pipeline_version,
                    event_id)
SELECT k, regexp_replace(k, '\.tar$', '.index.json'), h, b, n, 'v1', substr(h, 1, 32)
FROM unnest(%(shard_keys)s::text[], %(shard_sha256)s::text[], %(shard_bytes)s::int8[],
            %(shard_clips)s::int4[]) AS r(k, h, b, n);

-- step: clips
-- Array subscripts, not a join: rows come out (and lie on disk) in clip order, as in
-- manifest_seed.sql (a hash join scattered them by slot, and the refresh of manifest_episodes
-- then took minutes instead of seconds per slice of 50k episodes). Fixed-width arrays index in
-- O(1); the shard key is looked up among the few real shards.
INSERT INTO clips (clip_key, pipeline_version, episode_id, shard_key, clip_index, start_s,
                   duration_s, frame_count, mp4_offset, mp4_length, imu_offset, imu_length,
                   json_offset, json_length)
SELECT ep || '_' || lpad(k::text, 5, '0'), 'v1', ep,
       (%(shard_keys)s::text[])[1 + j / %(slots_per_shard)s],
       k, k * (%(slot_duration_s)s::float8[])[1 + j], (%(slot_duration_s)s::float8[])[1 + j],
       (%(slot_frame_count)s::int4[])[1 + j],
       (%(slot_mp4_offset)s::int8[])[1 + j], (%(slot_mp4_length)s::int8[])[1 + j],
       (%(slot_imu_offset)s::int8[])[1 + j], (%(slot_imu_length)s::int8[])[1 + j],
       (%(slot_json_offset)s::int8[])[1 + j], (%(slot_json_length)s::int8[])[1 + j]
FROM generate_series(0, %(rows)s - 1) i,
     LATERAL (SELECT 'ep' || lpad((i / %(per_episode)s)::text, 9, '0') AS ep,
                     i %% %(per_episode)s AS k,
                     i %% %(slots)s AS j) x;
