//! Label Studio annotations as votes (contract §12), without I/O: a webhook
//! body, or an annotation the sync read, becomes the votes of its mapped
//! controls. A vote that breaks contract §1 (an unknown label, a task without
//! the inference field) is made anyway: `run` rejects it to its DLQ with
//! the payload, so nothing disappears unseen.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::config::LabelStudio;

/// What the mapping takes from `[label_studio]`.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// Control name → voter_prompt_id (empty: every choices, rating and
    /// number control, named as itself).
    pub controls: BTreeMap<String, String>,
    /// Choice label → vote.
    pub values: BTreeMap<String, Value>,
    pub inference_id_field: String,
    pub model_id_field: String,
    pub inference_time_field: String,
}

impl Mapping {
    pub fn of(l: &LabelStudio) -> Mapping {
        Mapping {
            controls: l.controls.clone(),
            values: l
                .values
                .iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
            inference_id_field: l.inference_id_field.clone(),
            model_id_field: l.model_id_field.clone(),
            inference_time_field: l.inference_time_field.clone(),
        }
    }

    /// Whether a result of `control` (of `kind`, lower case) is a vote.
    fn maps(&self, control: &str, kind: &str) -> bool {
        if self.controls.is_empty() {
            VOTE_KINDS.contains(&kind)
        } else {
            self.controls.contains_key(control)
        }
    }

    fn rubric<'a>(&'a self, control: &'a str) -> &'a str {
        self.controls.get(control).map_or(control, String::as_str)
    }
}

fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => Value::from(*f),
        toml::Value::Boolean(b) => Value::Bool(*b),
        other => Value::String(other.to_string()),
    }
}

/// The control types that are votes (as a result's `type`).
const VOTE_KINDS: [&str; 3] = ["choices", "rating", "number"];

/// A rating's scale when the label config does not say.
pub const DEFAULT_MAX_RATING: f64 = 5.0;

/// What a project's label config says about its controls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Project {
    pub id: i64,
    /// Control name → type, lower case (`choices`, `rating`, …), from
    /// `parsed_label_config`.
    pub controls: BTreeMap<String, String>,
    /// Rating control → `maxRating` (only in the XML of `label_config`).
    pub max_rating: BTreeMap<String, f64>,
}

impl Project {
    /// From a project object as Label Studio sends it (webhook `project`,
    /// `GET /api/projects/{id}/`).
    pub fn of(p: &Value) -> Project {
        let controls = p["parsed_label_config"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let kind = v["type"].as_str().unwrap_or_default().to_ascii_lowercase();
                        (k.clone(), kind)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Project {
            id: p["id"].as_i64().unwrap_or_default(),
            controls,
            max_rating: max_ratings(p["label_config"].as_str().unwrap_or_default()),
        }
    }
}

/// `maxRating` of every `<Rating name=… maxRating=…>` tag of a label
/// config. A scan for the one tag and two attributes, not an XML parser:
/// label configs are small, and a tag this scan cannot read keeps the
/// default scale.
pub fn max_ratings(xml: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for tag in xml.split('<').skip(1) {
        let Some(rest) = tag.strip_prefix("Rating") else {
            continue;
        };
        if !rest.starts_with(|c: char| c.is_whitespace() || c == '/' || c == '>') {
            continue;
        }
        let attrs = rest.split('>').next().unwrap_or_default();
        let (Some(name), Some(max)) = (attribute(attrs, "name"), attribute(attrs, "maxRating"))
        else {
            continue;
        };
        if let Ok(m) = max.trim().parse::<f64>() {
            if m.is_finite() && m > 1.0 {
                out.insert(name.to_owned(), m);
            }
        }
    }
    out
}

/// The value of `name="…"` (or `'…'`) in a tag's attribute text.
fn attribute<'a>(attrs: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = attrs;
    while let Some(at) = rest.find(name) {
        let before_ok = at == 0 || rest.as_bytes()[at - 1].is_ascii_whitespace();
        let after = rest[at + name.len()..].trim_start();
        if let (true, Some(after)) = (before_ok, after.strip_prefix('=')) {
            let after = after.trim_start();
            let quote = after.chars().next()?;
            if quote == '"' || quote == '\'' {
                let body = &after[1..];
                return body.find(quote).map(|end| &body[..end]);
            }
        }
        rest = &rest[at + name.len()..];
    }
    None
}

/// One vote made from an annotation: its Kafka key (the inference id, or
/// empty when the task lacks it) and its JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedVote {
    pub key: String,
    pub vote_id: String,
    pub json: String,
}

/// The votes of one annotation of `task` in `project` (contract §12).
pub fn annotation_votes(
    map: &Mapping,
    project: &Project,
    task: &Value,
    annotation: &Value,
) -> Vec<MappedVote> {
    let data = &task["data"];
    let updated_at = annotation["updated_at"].as_str().unwrap_or_default();
    let annotation_id = id_text(&annotation["id"]);
    let completed_by = match &annotation["completed_by"] {
        Value::Object(o) => id_text(o.get("id").unwrap_or(&Value::Null)),
        other => id_text(other),
    };
    let vote = |control: &str, value: Value| -> MappedVote {
        let mut o = Map::new();
        let inference_id = data.get(&map.inference_id_field).filter(|v| !v.is_null());
        if let Some(id) = inference_id {
            o.insert("inference_id".into(), id.clone());
        }
        o.insert(
            "voter_id".into(),
            Value::String(format!("ls:{completed_by}")),
        );
        o.insert(
            "voter_prompt_id".into(),
            Value::String(map.rubric(control).to_owned()),
        );
        o.insert("vote".into(), value);
        o.insert("timestamp".into(), Value::String(updated_at.to_owned()));
        let vote_id = format!("ls:{}:{annotation_id}:{control}@{updated_at}", project.id);
        o.insert("vote_id".into(), Value::String(vote_id.clone()));
        for (field, name) in [
            ("model_id", &map.model_id_field),
            ("inference_time", &map.inference_time_field),
        ] {
            if let Some(v) = data.get(name).filter(|v| !v.is_null()) {
                o.insert(field.into(), v.clone());
            }
        }
        MappedVote {
            key: inference_id.map(id_text).unwrap_or_default(),
            vote_id,
            json: Value::Object(o).to_string(),
        }
    };
    if annotation["was_cancelled"].as_bool() == Some(true) {
        // A skip: one abstention per mapped control of the project.
        let controls: Vec<&str> = if map.controls.is_empty() {
            project
                .controls
                .iter()
                .filter(|(_, kind)| VOTE_KINDS.contains(&kind.as_str()))
                .map(|(name, _)| name.as_str())
                .collect()
        } else {
            map.controls.keys().map(String::as_str).collect()
        };
        return controls.into_iter().map(|c| vote(c, Value::Null)).collect();
    }
    let results = annotation["result"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    results
        .iter()
        .filter_map(|r| {
            let control = r["from_name"].as_str()?;
            let kind = r["type"].as_str().unwrap_or_default().to_ascii_lowercase();
            if !map.maps(control, &kind) {
                return None;
            }
            let value = &r["value"];
            let v = match kind.as_str() {
                "choices" => choice_vote(map, &value["choices"]),
                "rating" => {
                    let max = project
                        .max_rating
                        .get(control)
                        .copied()
                        .unwrap_or(DEFAULT_MAX_RATING);
                    match value["rating"].as_f64() {
                        Some(r) => serde_json::Number::from_f64((r - 1.0) / (max - 1.0))
                            .map_or(Value::Null, Value::Number),
                        None => value["rating"].clone(),
                    }
                }
                "number" => value["number"].clone(),
                // A mapped control of another type: its value as it is
                // (`run` rejects what is not a vote).
                _ => value.clone(),
            };
            Some(vote(control, v))
        })
        .collect()
}

/// The first chosen label, through `label_studio.values` when it lists it.
fn choice_vote(map: &Mapping, choices: &Value) -> Value {
    match choices.as_array().and_then(|c| c.first()) {
        Some(Value::String(label)) => map
            .values
            .get(label)
            .cloned()
            .unwrap_or_else(|| Value::String(label.clone())),
        Some(other) => other.clone(),
        // No choice made: the result as Label Studio wrote it (rejected
        // by `run` as an invalid vote, and visible in its DLQ).
        None => choices.clone(),
    }
}

/// An id (a JSON integer or string) as text.
fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A Label Studio vote id (`ls:<project>:<annotation>:<control>@<time>`)
/// as (project, annotation); None for any other id.
pub fn parse_vote_id(vote_id: &str) -> Option<(i64, i64)> {
    let rest = vote_id.strip_prefix("ls:")?;
    let mut parts = rest.splitn(3, ':');
    let project = parts.next()?.parse().ok()?;
    let annotation = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((project, annotation))
}

/// What the connect tests share: the recorded webhook bodies
/// (`tests/fixtures/label-studio`) and the default field names.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn fixture(name: &str) -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/label-studio")
            .join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    pub fn fields() -> Mapping {
        Mapping {
            inference_id_field: "inference_id".into(),
            model_id_field: "model_id".into(),
            inference_time_field: "inference_time".into(),
            ..Mapping::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    fn votes_of(map: &Mapping, body: &Value) -> Vec<Value> {
        let project = Project::of(&body["project"]);
        annotation_votes(map, &project, &body["task"], &body["annotation"])
            .into_iter()
            .map(|v| serde_json::from_str(&v.json).unwrap())
            .collect()
    }

    #[test]
    fn a_real_webhook_maps_every_control() {
        let body = fixture("004_ANNOTATION_UPDATED.json");
        let votes = votes_of(&fields(), &body);
        let at = "2026-11-25T22:41:54.035640Z";
        let expect = |control: &str, vote: Value| {
            serde_json::json!({
                "inference_id": "inf-1",
                "voter_id": "ls:2",
                "voter_prompt_id": control,
                "vote": vote,
                "timestamp": at,
                "vote_id": format!("ls:1:2:{control}@{at}"),
                "model_id": "gpt-x-2024",
                "inference_time": "2026-11-25T20:00:00Z",
            })
        };
        assert_eq!(
            votes,
            [
                expect("verdict", "Pass".into()),
                expect("support", "fully".into()),
                expect("quality", 1.0.into()),
                expect("score", 0.95.into()),
            ]
        );
        // Every vote is valid by contract §1.
        let opts = crate::input::DecodeOptions {
            max_message_bytes: 1 << 20,
            default_voter_prompt_id: None,
        };
        for v in &votes {
            crate::input::decode_vote(v.to_string().as_bytes(), &opts).unwrap();
        }
    }

    #[test]
    fn controls_values_and_ratings() {
        let mut body = fixture("004_ANNOTATION_UPDATED.json");
        let mut map = fields();
        map.controls.insert("verdict".into(), "correctness".into());
        map.controls.insert("quality".into(), "quality".into());
        map.values.insert("Pass".into(), 0.8.into());
        // A 10-point rating scale from the XML.
        let xml = body["project"]["label_config"]
            .as_str()
            .unwrap()
            .replace("maxRating=\"5\"", "maxRating=\"10\"");
        body["project"]["label_config"] = xml.into();
        body["annotation"]["result"][2]["value"]["rating"] = 4.into();
        let votes = votes_of(&map, &body);
        let got: Vec<(&str, &Value)> = votes
            .iter()
            .map(|v| (v["voter_prompt_id"].as_str().unwrap(), &v["vote"]))
            .collect();
        assert_eq!(
            got,
            [
                ("correctness", &0.8.into()),
                ("quality", &(3.0 / 9.0).into())
            ]
        );
        assert!(votes[0]["vote_id"].as_str().unwrap().contains(":verdict@"));
    }

    #[test]
    fn a_skip_is_one_abstention_per_mapped_control() {
        let mut body = fixture("004_ANNOTATION_UPDATED.json");
        body["annotation"]["was_cancelled"] = true.into();
        body["annotation"]["result"] = serde_json::json!([]);
        let votes = votes_of(&fields(), &body);
        let rubrics: Vec<&str> = votes
            .iter()
            .map(|v| v["voter_prompt_id"].as_str().unwrap())
            .collect();
        assert_eq!(rubrics, ["quality", "score", "support", "verdict"]);
        assert!(votes.iter().all(|v| v["vote"].is_null()));
        let mut map = fields();
        map.controls.insert("verdict".into(), "v".into());
        assert_eq!(votes_of(&map, &body).len(), 1);
    }

    #[test]
    fn what_breaks_the_rules_is_still_made() {
        let mut body = fixture("004_ANNOTATION_UPDATED.json");
        body["task"]["data"]
            .as_object_mut()
            .unwrap()
            .remove("inference_id");
        body["annotation"]["result"][0]["value"]["choices"] = serde_json::json!(["Maybe"]);
        let project = Project::of(&body["project"]);
        let votes = annotation_votes(&fields(), &project, &body["task"], &body["annotation"]);
        assert_eq!(votes.len(), 4);
        assert_eq!(votes[0].key, "");
        let v: Value = serde_json::from_str(&votes[0].json).unwrap();
        assert!(v.get("inference_id").is_none());
        assert_eq!(v["vote"], "Maybe");
    }

    #[test]
    fn every_recorded_webhook_maps_without_panic() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/label-studio");
        let mut annotations = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let body: Value =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            if body["annotation"].is_object() {
                annotations += 1;
                assert!(!votes_of(&fields(), &body).is_empty());
            }
        }
        assert!(annotations >= 10);
    }

    #[test]
    fn ratings_and_vote_ids_parse() {
        let xml = r#"<View><Rating name="q" toName="t" maxRating="10"/><Rating maxRating='3' name='r'></Rating><RatingX name="x" maxRating="7"/><Rating name="bad" maxRating="1"/></View>"#;
        let m = max_ratings(xml);
        assert_eq!(m.get("q"), Some(&10.0));
        assert_eq!(m.get("r"), Some(&3.0));
        assert_eq!(m.len(), 2);
        assert_eq!(
            parse_vote_id("ls:3:17:verdict@2026-11-25T22:41:54.035640Z"),
            Some((3, 17))
        );
        assert_eq!(parse_vote_id("ls:3:17"), None);
        assert_eq!(parse_vote_id("v-1"), None);
    }
}
