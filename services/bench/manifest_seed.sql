-- The `bench manifest` bulk load, in foreign-key order; every number is a bound parameter.
-- Geometry: %(per_episode)s clips an episode, %(per_session)s episodes a session,
-- %(per_shard)s clips a shard, %(devices)s devices; ids, raw keys, shard keys and sha256s shaped
-- like the pipeline's own. One episode in a hundred is rejected, one in ten has a warning.

-- step: devices
INSERT INTO devices (device_id)
SELECT 'dev' || lpad(d::text, 5, '0') FROM generate_series(0, %(devices)s - 1) d;

-- step: episodes
INSERT INTO episodes (episode_id, device_id, session_id, started_at, split, tags, status,
                      status_rank)
SELECT 'ep' || lpad(e::text, 9, '0'),
       'dev' || lpad((e %% %(devices)s)::text, 5, '0'),
       s,
       timestamptz '2026-01-01' + e * interval '37 seconds',
       CASE WHEN get_byte(sha256(convert_to(s, 'UTF8')), 0) < 26 THEN 'eval' ELSE 'train' END,
       ARRAY['synthetic', 'site=' || (e %% 7)::text],
       'sharded', 4
FROM generate_series(0, %(episodes)s - 1) e,
     LATERAL (SELECT 'sess' || lpad((e / %(per_session)s)::text, 9, '0') AS s) x;

-- step: raw objects
INSERT INTO raw_objects (object_key, episode_id, kind, sha256, size_bytes)
SELECT 'raw/' || device_id || '/2026/01/01/' || episode_id || '/' || h || '.mp4',
       episode_id, 'video', h, 120000000
FROM (SELECT device_id, episode_id, encode(sha256(convert_to(episode_id, 'UTF8')), 'hex') AS h
      FROM episodes) x;

-- step: probes
INSERT INTO decode_meta
SELECT episode_id, 'v1', md5(episode_id), 'mov,mp4,m4a,3gp,3g2,mj2', 100.0, 'h264', 1280, 720,
       30.0, 3000, 100, '[]'::jsonb
FROM episodes;

-- step: verdicts
INSERT INTO verdicts
SELECT episode_id, 'v1', md5(episode_id),
       CASE WHEN right(episode_id, 2) = '07' THEN 'reject'
            WHEN right(episode_id, 1) = '3' THEN 'accept_with_warnings'
            ELSE 'accept' END,
       '[]'::jsonb,
       CASE WHEN right(episode_id, 1) = '3'
            THEN '[{"code": "timestamp_gap", "message": "seeded"}]'::jsonb
            ELSE '[]'::jsonb END
FROM episodes;

-- step: shards
INSERT INTO shards (shard_key, index_key, sha256, size_bytes, clip_count, pipeline_version,
                    event_id)
SELECT 'shards/v1/' || substr(h, 1, 2) || '/' || h || '.tar',
       'shards/v1/' || substr(h, 1, 2) || '/' || h || '.index.json',
       h, 536870912, %(per_shard)s, 'v1', substr(h, 1, 32)
FROM (SELECT encode(sha256(convert_to('shard' || s::text, 'UTF8')), 'hex') AS h
      FROM generate_series(0, %(shards)s - 1) s) x;

-- step: clips
INSERT INTO clips (clip_key, pipeline_version, episode_id, shard_key, clip_index, start_s,
                   duration_s, frame_count, mp4_offset, mp4_length, imu_offset, imu_length,
                   json_offset, json_length)
SELECT ep || '_' || lpad(k::text, 5, '0'), 'v1', ep,
       'shards/v1/' || substr(h, 1, 2) || '/' || h || '.tar',
       k, k * 10.0, 10.0, 300,
       slot * 2000000 + 512, 1990000, slot * 2000000 + 1990912, 7328, slot * 2000000 + 1998848, 600
FROM generate_series(0, %(rows)s - 1) i,
     LATERAL (SELECT 'ep' || lpad((i / %(per_episode)s)::text, 9, '0') AS ep,
                     i %% %(per_episode)s AS k,
                     i %% %(per_shard)s AS slot,
                     encode(sha256(convert_to('shard' || (i / %(per_shard)s)::text, 'UTF8')),
                            'hex') AS h) x;
